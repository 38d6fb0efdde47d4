package sandboxtest

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// runFile runs a job with input files and returns its result.
func runFile(t *testing.T, rt sandbox.Runtime, code string, timeout time.Duration, in []sandbox.File, l sandbox.FileLimits) sandbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+60*time.Second)
	defer cancel()
	res, err := rt.Run(ctx, sandbox.Job{ID: "files", Code: code, Timeout: timeout, OutputCap: 4096, Files: in, FileLimits: l}, &EchoHost{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// fileNamed returns the result's file name, or fails.
func fileNamed(t *testing.T, res sandbox.Result, name string) []byte {
	t.Helper()
	for _, f := range res.Files {
		if f.Name == name {
			return f.Data
		}
	}
	t.Fatalf("no file %q in the result: files %v, notes %q, stderr %q", name, fileNames(res), res.Notes, res.Stderr)
	return nil
}

func fileNames(res sandbox.Result) []string {
	var n []string
	for _, f := range res.Files {
		n = append(n, f.Name)
	}
	return n
}

// noted fails unless one of the result's notes holds every part.
func noted(t *testing.T, res sandbox.Result, parts ...string) {
	t.Helper()
	for _, n := range res.Notes {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(n, p)
		}
		if all {
			return
		}
	}
	t.Errorf("no note with %q: notes %q", parts, res.Notes)
}

// runFiles checks files in and out: input files placed under the workspace
// before the code starts, what it writes under out/ sent back, and the
// hostile things code leaves there, each of which is refused with a note and
// harms neither the host nor the next job.
func runFiles(t *testing.T, rt sandbox.Runtime, run runFunc) {
	t.Run("InAndOut", func(t *testing.T) {
		csv := "city,n\na,1\nb,2\na,3\n"
		code := `import csv, os, collections
tot = collections.Counter()
for row in csv.DictReader(open("data/in.csv")):
    tot[row["city"]] += int(row["n"])
os.makedirs("out/sub", exist_ok=True)
with open("out/summary.csv", "w") as f:
    for k in sorted(tot): f.write("%s,%d\n" % (k, tot[k]))
open("out/sub/bin.dat", "wb").write(bytes(range(256)))
print(open("note.txt").read())`
		res := runFile(t, rt, code, short, []sandbox.File{{Name: "data/in.csv", Data: []byte(csv)}, {Name: "note.txt", Data: []byte("hello")}}, sandbox.FileLimits{})
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "hello\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
		if got := string(fileNamed(t, res, "summary.csv")); got != "a,4\nb,2\n" {
			t.Fatalf("summary.csv %q", got)
		}
		if got := fileNamed(t, res, "sub/bin.dat"); len(got) != 256 || got[255] != 255 {
			t.Fatalf("sub/bin.dat %v", got)
		}
		if len(res.Files) != 2 || len(res.Notes) != 0 {
			t.Fatalf("files %v, notes %q", fileNames(res), res.Notes)
		}
		// The next job starts with an empty workspace.
		if out := succeeds(t, run, "import os\nprint(sorted(os.listdir('.')))"); out != "[]\n" {
			t.Fatalf("next job's workspace: %s", out)
		}
	})
	t.Run("Bounds", func(t *testing.T) {
		code := `import os
os.makedirs("out", exist_ok=True)
for i in range(5): open("out/f%d" % i, "wb").write(b"x" * 1000)
open("out/big", "wb").write(b"y" * 5000)`
		res := runFile(t, rt, code, short, nil, sandbox.FileLimits{MaxFiles: 3, MaxFileBytes: 4096, MaxJobBytes: 2500})
		expect(t, res, sandbox.StatusSuccess, 0)
		if len(res.Files) != 2 {
			t.Fatalf("kept %v, want 2 files within 2500 bytes; notes %q", fileNames(res), res.Notes)
		}
		noted(t, res, "out/big", "over the limit of 4096 bytes")
		noted(t, res, "over 2500 bytes together")
	})
	t.Run("HostileOut", func(t *testing.T) {
		code := `import os
os.makedirs("out", exist_ok=True)
open("out/good.txt", "w").write("good")
os.symlink("/etc/passwd", "out/link")
os.symlink("/dev/zero", "out/dev")
os.mkfifo("out/fifo")
with open("out/sparse", "wb") as f: f.truncate(10 << 30)
open(b"out/bad-\xff-name", "wb").write(b"x")
try:
    os.mknod("out/null", 0o600 | 0o020000, os.makedev(1, 3))
    print("mknod worked")
except OSError:
    pass`
		res := runFile(t, rt, code, short, nil, sandbox.FileLimits{})
		expect(t, res, sandbox.StatusSuccess, 0)
		if got := string(fileNamed(t, res, "good.txt")); got != "good" || len(res.Files) != 1 {
			t.Fatalf("good.txt %q, files %v", got, fileNames(res))
		}
		noted(t, res, "out/link", "symbolic link")
		noted(t, res, "out/dev", "symbolic link")
		noted(t, res, "out/fifo", "FIFO")
		noted(t, res, "out/sparse", "10737418240 bytes")
		noted(t, res, "not UTF-8")
		if strings.Contains(res.Stdout, "mknod worked") {
			noted(t, res, "out/null", "device node")
		}
		if out := succeeds(t, run, "print('next job fine')"); out != "next job fine\n" {
			t.Fatalf("next job: %q", out)
		}
	})
	t.Run("ManyEmptyFiles", func(t *testing.T) {
		code := `import os
os.makedirs("out/many", exist_ok=True)
for i in range(100000):
    os.close(os.open("out/many/%d" % i, os.O_CREAT | os.O_WRONLY, 0o644))`
		res := runFile(t, rt, code, 90*time.Second, nil, sandbox.FileLimits{})
		expect(t, res, sandbox.StatusSuccess, 0)
		if len(res.Files) > sandbox.DefaultFileLimits().MaxFiles {
			t.Fatalf("%d files kept", len(res.Files))
		}
		noted(t, res, "more than 100 files")
		if out := succeeds(t, run, "import os\nprint(len(os.listdir('.')))"); out != "0\n" {
			t.Fatalf("next job: %q", out)
		}
	})
	t.Run("BadInputNames", func(t *testing.T) {
		// The host checks names before the runner; the runner refuses them too.
		res := runFile(t, rt, "print('ran')", short, []sandbox.File{{Name: "../escape", Data: []byte("x")}}, sandbox.FileLimits{})
		if res.Status != sandbox.StatusError || strings.Contains(res.Stdout, "ran") {
			t.Fatalf("a job with input ../escape ran: %+v", res)
		}
		if out := succeeds(t, run, "print('next job fine')"); out != "next job fine\n" {
			t.Fatalf("next job: %q", out)
		}
	})
}

// runSessionFiles checks that a session keeps its workspace: files one job
// writes are there for the next, input files add to them, and out/ sends a
// file again only when it changed.
func runSessionFiles(t *testing.T, rt sandbox.SessionRuntime, session string) {
	t.Cleanup(func() { _ = rt.EndSession(session) })
	in := func(code string, files ...sandbox.File) sandbox.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := rt.RunInSession(ctx, session, sandbox.Job{ID: "s", Code: code, Timeout: short, OutputCap: 4096, Files: files}, &EchoHost{})
		if err != nil {
			t.Fatalf("RunInSession: %v", err)
		}
		expect(t, res, sandbox.StatusSuccess, 0)
		return res
	}
	res := in("import os\nos.makedirs('out', exist_ok=True)\nopen('kept.txt', 'w').write('one')\nopen('out/r.txt', 'w').write('r1')", sandbox.File{Name: "a.txt", Data: []byte("A")})
	if got := fileNamed(t, res, "r.txt"); string(got) != "r1" {
		t.Fatalf("r.txt %q", got)
	}
	res = in("print(open('kept.txt').read(), open('a.txt').read(), open('b.txt').read())", sandbox.File{Name: "b.txt", Data: []byte("B")})
	if res.Stdout != "one A B\n" || len(res.Files) != 0 {
		t.Fatalf("second job: stdout %q, files %v (r.txt unchanged must not come again)", res.Stdout, fileNames(res))
	}
	res = in("open('out/r.txt', 'w').write('r2 longer')")
	if got := fileNamed(t, res, "r.txt"); string(got) != "r2 longer" {
		t.Fatalf("changed r.txt %q", got)
	}
}

// runFigures checks that plt.show() and the figures a job leaves open come
// back as PNG files. It needs matplotlib in the sandbox image: without it the
// test skips, unless MCPEXEC_REQUIRE_PODMAN=1.
func runFigures(t *testing.T, rt sandbox.Runtime, run runFunc) {
	t.Run("MatplotlibFigures", func(t *testing.T) {
		if out := run(t, "import importlib.util\nprint(importlib.util.find_spec('matplotlib') is not None)", short, nil); out.Stdout != "True\n" {
			if os.Getenv("MCPEXEC_REQUIRE_PODMAN") == "1" {
				t.Fatalf("the sandbox image has no matplotlib (MCPEXEC_REQUIRE_PODMAN=1): build the data image (deploy/sandbox, recipe 3 or later)")
			}
			t.Skip("the sandbox image has no matplotlib: build the data image (deploy/sandbox, recipe 3 or later)")
		}
		code := `import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]})
df.plot(x="x", y="y")
plt.show()
plt.figure()
plt.bar(["a", "b"], [1, 2])
print("drawn")`
		res := runFile(t, rt, code, 60*time.Second, nil, sandbox.FileLimits{})
		expect(t, res, sandbox.StatusSuccess, 0)
		png := []byte("\x89PNG\r\n\x1a\n")
		for _, name := range []string{"figure-1.png", "figure-2.png"} {
			if b := fileNamed(t, res, name); !bytes.HasPrefix(b, png) || len(b) < 1000 {
				t.Fatalf("%s is not a PNG of a chart (%d bytes)", name, len(b))
			}
		}
	})
}
