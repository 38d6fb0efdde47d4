package sandbox

import _ "embed"

// RunnerScript is the in-sandbox Python runner. Runtimes place it in the sandbox
// read-only and start it as `python3 runner.py SOCKET`.
//
//go:embed runner.py
var RunnerScript []byte
