package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestFilesInAndOut is issue 24's done-when for files, through the real
// front-end binary with Podman sandboxes: through the official TypeScript
// SDK, a CSV given in files becomes a summary CSV the code writes to
// /workspace/out, whose resource_link reads back exactly those bytes; a
// DataFrame plot and plt.show() come back as an image content item holding a
// PNG. Through /api/jobs the same job serves the file at
// /api/jobs/{id}/files/{name}, a later job reads it with job_file and takes
// it as an input by its URI, and another namespace gets "no such job" over
// MCP and HTTP.
func TestFilesInAndOut(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	scriptPath := testutil.NodeScript(t, "files_client.mjs")
	bin := buildFrontend(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("files-token-a-0123 team-a\nfiles-token-b-0123 team-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fe := startFrontend(t, bin, "--discover=false", "--pool", "1", "--log-level", "warn", "--data", filepath.Join(dir, "data"),
		"--worker-id", "files", "--auth-tokens-file", tokens)
	base := "http://" + fe.addr

	t.Run("SDK", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "node", scriptPath, base+"/mcp", "files-token-a-0123", "files-token-b-0123").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				out = append(out, ee.Stderr...)
			}
			t.Fatalf("node client: %v\n%s", err, out)
		}
		var r struct {
			Text, LinkURI, LinkMime, ReadText, PlotText, ImageMime, ImageData, OtherError string
			IsError, PlotError                                                            bool
			Files                                                                         []struct {
				Name, MimeType, URI string
				Size                int64
			}
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatalf("client output %s: %v", out, err)
		}
		want := "region,total\nnorth,7\nsouth,5\n"
		if r.IsError || !strings.HasPrefix(r.Text, "regions: 2") || r.ReadText != want || r.LinkMime != "text/csv" {
			t.Fatalf("summary: %+v", r)
		}
		if len(r.Files) != 1 || r.Files[0].Name != "summary.csv" || r.Files[0].URI != r.LinkURI || r.Files[0].Size != int64(len(want)) {
			t.Fatalf("structuredContent.files %+v", r.Files)
		}
		if !strings.Contains(r.OtherError, "no such job") {
			t.Fatalf("another namespace reading %s: %q", r.LinkURI, r.OtherError)
		}
		if r.PlotError || r.ImageMime != "image/png" {
			t.Fatalf("plot: %q error %v mime %q", r.PlotText, r.PlotError, r.ImageMime)
		}
		pngBytes, err := base64.StdEncoding.DecodeString(r.ImageData)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(pngBytes))
		if err != nil || img.Bounds().Dx() < 100 {
			t.Fatalf("the image is not a PNG of a chart: %v", err)
		}
	})

	t.Run("HTTP", func(t *testing.T) {
		do := func(method, path, token string, body any) (int, []byte) {
			t.Helper()
			var rd io.Reader
			if body != nil {
				b, _ := json.Marshal(body)
				rd = bytes.NewReader(b)
			}
			req, _ := http.NewRequest(method, base+path, rd)
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }() // read below: nothing to report
			got, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, got
		}
		a, b := "files-token-a-0123", "files-token-b-0123"
		code := `import os
os.makedirs("out", exist_ok=True)
rows = open("in/data.csv").read().splitlines()[1:]
open("out/summary.csv", "w").write("rows,%d\n" % len(rows))`
		if st, got := do("POST", "/api/jobs", a, map[string]any{"id": "summarize", "code": code,
			"files": []map[string]string{{"name": "in/data.csv", "base64": base64.StdEncoding.EncodeToString([]byte("h\n1\n2\n3\n"))}}}); st != 201 {
			t.Fatalf("submit: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/summarize/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"status":"success"`)) {
			t.Fatalf("wait: %d %s", st, got)
		}
		st, got := do("GET", "/api/jobs/summarize/files/summary.csv", a, nil)
		if st != 200 || string(got) != "rows,3\n" {
			t.Fatalf("GET the file: %d %q", st, got)
		}
		if st, got := do("GET", "/api/jobs/summarize/files/summary.csv", b, nil); st != 404 || !bytes.Contains(got, []byte("no such job")) {
			t.Fatalf("another namespace's GET: %d %s", st, got)
		}
		// A re-run takes its parent's input files.
		if st, got := do("POST", "/api/jobs/summarize/retry", a, map[string]string{"id": "summarize-again"}); st != 201 {
			t.Fatalf("retry: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/summarize-again/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"status":"success"`)) {
			t.Fatalf("the re-run: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/summarize-again/files/summary.csv", a, nil); st != 200 || string(got) != "rows,3\n" {
			t.Fatalf("the re-run's file: %d %q", st, got)
		}
		// A later job reads it with job_file, and takes it as an input by URI.
		later := `print(job_file("summarize", "summary.csv").decode(), open("prev.csv").read(), end="")`
		if st, got := do("POST", "/api/jobs", a, map[string]any{"id": "later", "code": later,
			"files": []map[string]string{{"name": "prev.csv", "uri": "mcpexec://jobs/summarize/files/summary.csv"}}}); st != 201 {
			t.Fatalf("submit the later job: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/later/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"stdout":"rows,3\n rows,3\n"`)) {
			t.Fatalf("later job: %d %s", st, got)
		}
		// JavaScript reads it too, when the image runs JavaScript.
		if st, got := do("POST", "/api/jobs", a, map[string]any{"id": "later-js", "language": "javascript",
			"code": `process.stdout.write((await jobFile("summarize", "summary.csv")).toString())`}); st == 201 {
			if st, got := do("GET", "/api/jobs/later-js/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"stdout":"rows,3\n"`)) {
				t.Fatalf("JavaScript job: %d %s", st, got)
			}
		} else if !bytes.Contains(got, []byte("javascript")) {
			t.Fatalf("submit the JavaScript job: %d %s", st, got)
		}
		// Another namespace can neither read it from code nor name it as an input.
		if st, got := do("POST", "/api/jobs", b, map[string]any{"id": "spy", "code": `print(job_file("summarize", "summary.csv"))`}); st != 201 {
			t.Fatalf("submit spy: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/spy/wait?timeout=2m", b, nil); st != 200 || !bytes.Contains(got, []byte("no such job")) || bytes.Contains(got, []byte("rows,3")) {
			t.Fatalf("spy job: %d %s", st, got)
		}
		if st, got := do("POST", "/api/jobs", b, map[string]any{"code": "print(1)",
			"files": []map[string]string{{"name": "x.csv", "uri": "mcpexec://jobs/summarize/files/summary.csv"}}}); st != 400 || !bytes.Contains(got, []byte("no such job")) {
			t.Fatalf("spy input by URI: %d %s", st, got)
		}
		// A session keeps its workspace: files one call wrote are there for the
		// next, and files given with a call add to them.
		if st, got := do("POST", "/api/jobs", a, map[string]any{"id": "s1", "session": "keep", "code": `open("notes.txt", "w").write("from call 1")`,
			"files": []map[string]string{{"name": "a.txt", "text": "A"}}}); st != 201 {
			t.Fatalf("session call 1: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/s1/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"status":"success"`)) {
			t.Fatalf("session call 1: %d %s", st, got)
		}
		if st, got := do("POST", "/api/jobs", a, map[string]any{"id": "s2", "session": "keep", "code": `print(open("notes.txt").read(), open("a.txt").read(), open("b.txt").read())`,
			"files": []map[string]string{{"name": "b.txt", "text": "B"}}}); st != 201 {
			t.Fatalf("session call 2: %d %s", st, got)
		}
		if st, got := do("GET", "/api/jobs/s2/wait?timeout=2m", a, nil); st != 200 || !bytes.Contains(got, []byte(`"stdout":"from call 1 A B\n"`)) {
			t.Fatalf("session call 2: %d %s", st, got)
		}
		if st, got := do("POST", "/api/jobs", a, map[string]any{"code": "print(1)",
			"files": []map[string]string{{"name": "../escape", "text": "x"}}}); st != 400 || !bytes.Contains(got, []byte("files[0].name")) {
			t.Fatalf("bad input name: %d %s", st, got)
		}
	})
}
