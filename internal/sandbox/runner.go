package sandbox

import (
	"crypto/rand"
	_ "embed" // the runner script
	"encoding/hex"
)

// RunnerScript is the in-sandbox Python runner. Runtimes place it in the sandbox
// read-only and start it as `python3 runner.py SOCKET`.
//
//go:embed runner.py
var RunnerScript []byte

// SecretEnv is the environment variable that gives a runner the secret it
// proves itself with in its hello (the runner removes it from its
// environment before any code runs).
const SecretEnv = "MCPEXEC_RUNNER_SECRET"

// NewSecret returns a fresh runner secret.
func NewSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
