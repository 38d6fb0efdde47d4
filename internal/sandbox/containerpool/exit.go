package containerpool

// This file words, for the Engines, how a container ended.
import (
	"fmt"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// ExitNote is Engine.ExitNote's text for a container that exited with code;
// msg is the engine's error for it ("" for none).
func ExitNote(code int, msg string) string {
	note := fmt.Sprintf(" (container exited with code %d", code)
	if msg != "" {
		note += ": " + msg
	}
	return note + ")"
}

// Lost is res of a job whose runner went away mid-job, before anything
// more is known: what Engine.Lost returns when it cannot tell how the
// container ended.
func Lost(res sandbox.Result) sandbox.Result {
	res.Status = sandbox.StatusError
	res.ExitCode = -1
	res.Error = "sandbox exited unexpectedly"
	return res
}

// Exited is res of a job whose runner went away with its container, which
// exited with code; oomKilled is the engine's word that the kernel killed
// it for memory, and memory the limit that names in the error.
//
// A SIGKILL (137) cannot come from the code itself: the runner is PID 1 of
// its PID namespace, which ignores signals it has no handler for when they
// come from inside. So with a memory limit, 137 is the kernel's OOM killer
// (or an operator).
func Exited(res sandbox.Result, code int, oomKilled bool, memory int64) sandbox.Result {
	res.Status = sandbox.StatusError
	if oomKilled || (code == 137 && memory > 0) {
		res.ExitCode = 137
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and was killed", sandbox.FormatBytes(memory))
		return res
	}
	res.ExitCode = code
	res.Error = fmt.Sprintf("sandbox exited unexpectedly (exit code %d)", code)
	return res
}
