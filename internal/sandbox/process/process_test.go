package process_test

import (
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox/process"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
)

func TestConformance(t *testing.T) {
	rt, err := process.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	})
	sandboxtest.Run(t, rt, sandboxtest.Options{})
}
