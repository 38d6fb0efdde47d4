package mcpclients

import (
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// processAlive reports whether cmd's process has not exited, without reaping it
// (the transport waits for it when the session closes).
func processAlive(cmd *exec.Cmd) bool {
	if cmd.Process == nil {
		return true
	}
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if err != nil {
		return false // no such child: it is gone
	}
	return info.Signo == 0 // WNOHANG with no state change leaves info zeroed
}

// setProcessGroup puts the server in its own process group, so that stopping it
// also stops what it spawned (npx, uvx and shells start the real server as a
// grandchild).
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
