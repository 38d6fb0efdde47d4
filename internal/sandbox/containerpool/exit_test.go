package containerpool_test

import (
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

func TestExited(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code      int
		oomKilled bool
		memory    int64
		wantCode  int
		wantError string
	}{
		{1, false, 96 << 20, 1, "sandbox exited unexpectedly (exit code 1)"},
		{137, false, 96 << 20, 137, "the sandbox hit its memory limit (96 MiB) and was killed"},
		{137, false, 0, 137, "sandbox exited unexpectedly (exit code 137)"},
		{0, true, 96 << 20, 137, "the sandbox hit its memory limit (96 MiB) and was killed"},
	} {
		res := containerpool.Exited(containerpool.Lost(sandbox.Result{Stdout: "so far"}), c.code, c.oomKilled, c.memory)
		if res.Status != sandbox.StatusError || res.ExitCode != c.wantCode || res.Error != c.wantError || res.Stdout != "so far" {
			t.Errorf("Exited(%d, %v, %d) = %+v", c.code, c.oomKilled, c.memory, res)
		}
	}
	if n := containerpool.ExitNote(3, "oci runtime error"); n != " (container exited with code 3: oci runtime error)" {
		t.Errorf("ExitNote = %q", n)
	}
	if n := containerpool.ExitNote(0, ""); n != " (container exited with code 0)" {
		t.Errorf("ExitNote = %q", n)
	}
}
