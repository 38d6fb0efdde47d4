package sandboxtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// runnerFor runs jobs of lang ("" or sandbox.Python, sandbox.JavaScript) on
// rt, with a 4 KiB output cap and the echo host unless one is given.
func runnerFor(rt sandbox.Runtime, lang string) runFunc {
	return func(t *testing.T, code string, timeout time.Duration, host sandbox.Host) sandbox.Result {
		t.Helper()
		if host == nil {
			host = &EchoHost{}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout+60*time.Second)
		defer cancel()
		res, err := rt.Run(ctx, sandbox.Job{ID: t.Name(), Code: code, Language: lang, Timeout: timeout, OutputCap: 4096}, host)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		return res
	}
}

// basics are one language's programs for the checks every language passes
// alike: the same outcome from the same kind of code.
type basics struct {
	print42 string // prints 42
	await   string // awaits at top level, then prints "awaited"
	// raise prints "before", then fails on line 2 with an error whose report
	// (stderr) holds every one of raiseMarks, and res.Error starts with
	// raiseError when it is set.
	raise      string
	raiseMarks []string
	raiseError string
	exit3      string // exits with code 3
	exit0      string // exits with code 0 before its last line
	syntax     string // does not compile
	loop       string // never ends
	// flood prints 2000 lines of 100 bytes and writes 10000 bytes to stderr.
	flood string
	uid   string // prints its uid and gid
}

var pythonBasics = basics{
	print42:    "print(6*7)",
	await:      "import asyncio\nawait asyncio.sleep(0.01)\nprint('awaited')",
	raise:      "print('before')\n1/0",
	raiseMarks: []string{"ZeroDivisionError", "Traceback"},
	exit3:      "import sys\nsys.exit(3)",
	exit0:      "raise SystemExit(0)\nprint('not reached')",
	syntax:     "def (:",
	loop:       "while True:\n    pass",
	flood:      "import sys\nfor i in range(2000):\n    print('x'*100)\nsys.stderr.write('e'*10000)",
	uid:        "import os\nprint(os.getuid(), os.getgid())",
}

var javaScriptBasics = basics{
	print42:    "console.log(6*7)",
	await:      "await new Promise((r) => setTimeout(r, 10))\nconsole.log('awaited')",
	raise:      "console.log('before')\nnull.x",
	raiseMarks: []string{"TypeError", "<code>:2"},
	raiseError: "TypeError:",
	exit3:      "process.exit(3)",
	exit0:      "await null\nprocess.exit(0)\nconsole.log('not reached')",
	syntax:     "function (",
	loop:       "while (true) {}",
	flood:      "for (let i = 0; i < 2000; i++) console.log('x'.repeat(100))\nprocess.stderr.write('e'.repeat(10000))",
	uid:        "console.log(process.getuid(), process.getgid())",
}

// runBasics runs the checks of b with run.
func runBasics(t *testing.T, run runFunc, b basics) {
	t.Run("PrintsOutput", func(t *testing.T) {
		if out := succeeds(t, run, b.print42); out != "42\n" {
			t.Fatalf("stdout %q, want %q", out, "42\n")
		}
	})
	t.Run("TopLevelAwait", func(t *testing.T) {
		if out := succeeds(t, run, b.await); out != "awaited\n" {
			t.Fatalf("stdout %q", out)
		}
	})
	t.Run("ExceptionIsError", func(t *testing.T) {
		res := run(t, b.raise, short, nil)
		expect(t, res, sandbox.StatusError, 1)
		for _, m := range b.raiseMarks {
			if !strings.Contains(res.Stderr, m) {
				t.Fatalf("stderr lacks %q: %q", m, res.Stderr)
			}
		}
		if !strings.HasPrefix(res.Error, b.raiseError) {
			t.Fatalf("error %q, want it to start with %q", res.Error, b.raiseError)
		}
		if res.Stdout != "before\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		expect(t, run(t, b.exit3, short, nil), sandbox.StatusError, 3)
		res := run(t, b.exit0, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "not reached") {
			t.Fatalf("code ran past its exit: %q", res.Stdout)
		}
	})
	t.Run("SyntaxError", func(t *testing.T) {
		res := run(t, b.syntax, short, nil)
		expect(t, res, sandbox.StatusError, 1)
		if !strings.Contains(res.Stderr, "SyntaxError") {
			t.Fatalf("stderr %q", res.Stderr)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		res := run(t, b.loop, time.Second, nil)
		if res.Status != sandbox.StatusTimeout {
			t.Fatalf("status %s, want timeout (%s)", res.Status, res.Error)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Fatalf("timeout of 1s took %s", el)
		}
	})
	t.Run("OutputCapped", func(t *testing.T) {
		res := run(t, b.flood, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if len(res.Stdout) != 4096 || !res.StdoutTruncated || len(res.Stderr) != 4096 || !res.StderrTruncated {
			t.Fatalf("stdout %d bytes (cut %v), stderr %d (cut %v), want 4096 and cut", len(res.Stdout), res.StdoutTruncated, len(res.Stderr), res.StderrTruncated)
		}
	})
}

// runsAsNobody: b's code runs as uid and gid 65534.
func runsAsNobody(t *testing.T, run runFunc, b basics) {
	t.Run("RunsAsNobody", func(t *testing.T) {
		if out := succeeds(t, run, b.uid); out != "65534 65534\n" {
			t.Fatalf("uid/gid %q", out)
		}
	})
}
