//go:build !linux

package mcpclients

import "os/exec"

// processAlive cannot look without reaping here: a dead server is found by the
// failed call instead.
func processAlive(*exec.Cmd) bool { return true }

func setProcessGroup(*exec.Cmd) {}
