package process_test

import (
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestConformance(t *testing.T) {
	rt := testutil.ProcessRuntime(t)
	sandboxtest.Run(t, rt, sandboxtest.Options{})
}

// BenchmarkCall: go test -bench Call -benchtime 20x.
func BenchmarkCall(b *testing.B) { sandboxtest.BenchCall(b, testutil.ProcessRuntime(b)) }
