package sandboxtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// DataStack: rt runs the data image with sandbox.DefaultPreload. numpy,
// pandas and pyplot are loaded before the code imports them (the zygote
// imported them); display() and a DataFrame left as the last expression print
// a compact table, and no other trailing value is printed; the container,
// with the data stack in its memory, still serves its namespace's next job
// (the sweep's "memory still held" check passes with them loaded): each
// job waits for it to be armed again, as a job sent sooner would take a
// warm container; two jobs draw different random numbers; code that
// names none of the stack runs in a process that does not hold it; and a
// container started before any job used the stack (which imports it at its
// first job that does) and one started after give the code the same.
func DataStack(t *testing.T, rt interface {
	sandbox.Runtime
	Armed(tenant string) int
}) {
	run := func(code string) sandbox.Result {
		t.Helper()
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "data", Tenant: "data", Code: code, Timeout: 60 * time.Second}, nil)
		if err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("run: %v %+v", err, res)
		}
		return res
	}
	first := run(`import socket, sys
print(socket.gethostname())
print("preloaded:", all(m in sys.modules for m in ("numpy", "pandas", "matplotlib.pyplot")))
import pandas as pd, numpy as np
df = pd.DataFrame({"x": np.arange(100), "y": np.arange(100) ** 2, "label": ["row %d" % i for i in range(100)]})
display(df)
print("--")
df[["x", "y"]].describe()`)
	host, rest, _ := strings.Cut(first.Stdout, "\n")
	if !strings.HasPrefix(rest, "preloaded: True\n") {
		t.Fatalf("the data stack was not loaded ahead of the code: %q", first.Stdout)
	}
	table, described, _ := strings.Cut(rest, "--\n")
	if !strings.Contains(table, "[100 rows x 3 columns]") || !strings.Contains(table, "row 99") || strings.Contains(table, "row 50") {
		t.Fatalf("display(df) is not a compact table of the first and last rows: %q", table)
	}
	if lines := strings.Count(table, "\n"); lines > 25 {
		t.Fatalf("display(df) printed %d lines", lines)
	}
	if !strings.Contains(described, "mean") || !strings.Contains(described, "49.5") {
		t.Fatalf("a trailing DataFrame was not shown: %q", described)
	}
	// display(fig) shows the figure once, as a picture of the result.
	WaitArmed(t, rt, "data")
	pics := run(`import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [3, 1, 2])
display(fig)
print(len(plt.get_fignums()))`)
	if strings.TrimSpace(pics.Stdout) != "0" || len(pics.Files) != 1 || pics.Files[0].Name != "figure-1.png" {
		t.Fatalf("display(fig): stdout %q, files %+v, notes %v", pics.Stdout, pics.Files, pics.Notes)
	}
	WaitArmed(t, rt, "data")
	second := run("import socket\nprint(socket.gethostname())\n1 + 1")
	if got := strings.TrimSpace(second.Stdout); got != host {
		t.Fatalf("the next job of the namespace ran in %q, not in %q: the container was retired (memory held after the sweep?); or a trailing value was printed", got, host)
	}
	// random came with the data stack, so every job's process inherits the
	// zygote's generator: each is seeded again (random's at-fork handler,
	// which a fork that skips Python's handlers would lose), and jobs do not
	// replay one sequence.
	const draw = "import sys\nprint('random' in sys.modules)\nimport random, numpy\nprint(random.random(), random.getrandbits(64))"
	WaitArmed(t, rt, "data")
	a := run(draw).Stdout
	WaitArmed(t, rt, "data")
	b := run(draw).Stdout
	if !strings.HasPrefix(a, "True\n") || a == b {
		t.Fatalf("two jobs' random draws (random preloaded?): %q and %q", a, b)
	}
	// Code that names none of the stack is forked from a zygote without it
	// (its fork, copy-on-write faults and teardown are those of a small
	// process), in the same container.
	WaitArmed(t, rt, "data")
	plain := run("import sys, socket\nprint(socket.gethostname(), sorted(m for m in ('nump' + 'y', 'pand' + 'as') if m in sys.modules))")
	if got := strings.TrimSpace(plain.Stdout); got != host+" []" {
		t.Fatalf("code that names no preloaded module: %q, want %q (a process without the stack, in the same container)", got, host+" []")
	}
	// The first container started before any job used the stack, and
	// imported it at its first such job (--preload-lazy); one started
	// since imports it before its first job. Both give the code the stack
	// loaded.
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "data-2", Tenant: "data-2", Timeout: 60 * time.Second,
		Code: "import socket, sys\nprint(socket.gethostname(), all(m in sys.modules for m in ('numpy', 'pandas')))"}, nil)
	if err != nil || res.Status != sandbox.StatusSuccess {
		t.Fatalf("run in another namespace: %v %+v", err, res)
	}
	if other, loaded, _ := strings.Cut(strings.TrimSpace(res.Stdout), " "); other == host || loaded != "True" {
		t.Fatalf("another namespace's data job: %q (want another container, the stack loaded ahead)", res.Stdout)
	}
}
