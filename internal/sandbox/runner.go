package sandbox

import (
	"crypto/rand"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// runnerFiles are the in-sandbox runner: runner.py, which runtimes start as
// `python3 runner.py SOCKET`, the modules beside it, and the JavaScript
// executor it starts for JavaScript jobs (mcpexec_executor.cjs, run by Node.js).
//
//go:embed runner.py mcpexec_*.py mcpexec_executor.cjs
var runnerFiles embed.FS

// WriteRunner writes the runner's files into dir, read-only; runtimes mount
// or use dir as the runner's directory.
func WriteRunner(dir string) error {
	entries, err := runnerFiles.ReadDir(".")
	if err != nil {
		return err
	}
	for _, e := range entries {
		data, err := runnerFiles.ReadFile(e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o444); err != nil {
			return fmt.Errorf("write runner: %w", err)
		}
	}
	return nil
}

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
