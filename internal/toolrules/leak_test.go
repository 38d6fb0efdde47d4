package toolrules_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
