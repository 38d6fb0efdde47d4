package mcpserver

import (
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them. No request
// of these tests takes long: a server that stops answering fails the test that
// waits for it within minutes, naming it, instead of hanging the package until
// go test's timeout.
func TestMain(m *testing.M) {
	http.DefaultClient.Timeout = 2 * time.Minute
	goleak.VerifyTestMain(m)
}
