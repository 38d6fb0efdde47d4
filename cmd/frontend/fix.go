package main

import (
	"errors"
	"os/exec"
	"strings"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// startFix is the advice for a stack that did not start, from its error.
func startFix(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, sandbox.ErrNoImage):
		return "build the sandbox image: `sudo deploy/sandbox/build.sh` (or `make image`); with --build-image (the default) the front-end builds it itself when it runs as root"
	case strings.Contains(msg, "podman") && !onPath("podman"):
		return "install Podman: `sudo apt-get install podman runc uidmap` (or `make deps`), then build the image with `make image`; or run workers on another host and join their broker with --nats"
	case strings.Contains(msg, "podman"):
		return "check Podman: `frontend doctor` says what is wrong and how to fix it"
	case strings.Contains(msg, "NATS") || strings.Contains(msg, "nats"):
		return "start the broker (`broker --listen HOST:PORT`) or point --nats (MCPEXEC_NATS) at a running one; `frontend doctor --nats URL` checks it"
	}
	return "`frontend doctor` checks every part and says how to fix what fails"
}

func onPath(prog string) bool {
	_, err := exec.LookPath(prog)
	return err == nil
}
