package console_test

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcpexec/mcpexec/internal/testutil"
)

// axe is axe-core (MPL-2.0, testdata/axe-LICENSE), vendored from npm
// (`npm pack axe-core@4.14.1`, package/axe.min.js): the accessibility check.
//
//go:embed testdata/axe-4.14.1.min.js
var axe string

// MaxPageBytes is the most one console page may transfer (HTML, scripts,
// styles, icon and its API answers).
const MaxPageBytes = 300 << 10

// TestConsolePages opens every page at 1280 and 320 px wide and checks each:
// no serious or critical accessibility violation (axe-core), no console
// error, nothing wider than the screen, and at most MaxPageBytes
// transferred. With MCPEXEC_SCREENSHOTS=1 it writes each page's screenshot
// to docs/screenshots/ (the README links them).
func TestConsolePages(t *testing.T) {
	f := startFleet(t, testutil.ProcessRuntime(t), true)
	id := f.submit(t, tokA, map[string]any{"code": "# say hello through the test server\nr = await mcp_ts.echo(text='hello')\nprint(r)\nsave_memory('notes', {'seen': 1})",
		"servers": []string{"ts"}, "labels": map[string]string{"team": "docs"}})
	f.wait(t, tokA, id)
	for i := range 3 {
		f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": fmt.Sprintf("print(%d)", i), "labels": map[string]string{"batch": "b1"}}))
	}
	f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "def twice(n):\n    \"\"\"Twice n.\"\"\"\n    return 2 * n\n\nsave_tool(twice)", "session": "notebook"}))
	// The approvals page is checked with a call waiting (asked just before,
	// as a job's time bounds the wait; denied after).
	parkCall := func(t *testing.T) string {
		denyAll(t, f, tokA)
		id := f.submit(t, tokA, map[string]any{"code": "# asks a person first\nr = await mcp_ts.add(a=2, b=40, note='x' * 300)\nprint(r)", "servers": []string{"ts"}})
		return `document.querySelector('article.approval:has(a[href="#/job/` + id + `"]) .job-code .hl') !== null && document.getElementById('approvals-count').textContent === '1'`
	}
	t.Cleanup(func() { denyAll(t, f, tokA) })
	p := newPage(t, f.url)
	pages := []struct{ name, hash, ready string }{
		{"signin", "#/jobs", `document.getElementById('token') !== null`},
		{"jobs", "#/jobs", `document.querySelectorAll('#jobs-body tr').length >= 4 && document.getElementById('live').textContent === 'live'`},
		{"job", "#/job/" + id, `document.getElementById('timeline') !== null && document.getElementById('timeline').textContent.includes('call ts.echo')`},
		{"fleet", "#/fleet", `document.getElementById('workers') !== null`},
		{"memory", "#/memory", `document.querySelector('button[data-key="notes"]') !== null`},
		{"sessions", "#/sessions", `document.querySelector('tr[data-name="notebook"]') !== null && document.querySelector('details[data-tool="twice"]') !== null`},
		{"charts", "#/charts", `document.querySelectorAll('figure.chartbox').length === 3`},
		{"approvals", "#/approvals", ""}, // parkCall's
	}
	shots := os.Getenv("MCPEXEC_SCREENSHOTS") == "1"
	for _, width := range []int64{1280, 320} {
		for _, pg := range pages {
			t.Run(fmt.Sprintf("%s-%d", pg.name, width), func(t *testing.T) {
				p.on(t)
				p.do(chromedp.EmulateViewport(width, 900))
				setup := `sessionStorage.setItem('mcpexec.token', ` + js(tokA) + `)`
				if pg.name == "signin" {
					setup = `sessionStorage.clear()`
				}
				ready := pg.ready
				if pg.name == "approvals" {
					ready = parkCall(t)
				}
				p.open(pg.hash, setup)
				p.until(pg.name+" ready", ready)
				if pg.name == "memory" {
					p.do(chromedp.Click(chromedp.CSS(`button[data-key="notes"]`)))
					p.until("the editor", `document.getElementById('m-value') !== null`)
				}
				if pg.name == "signin" {
					_ = p.takeErrors() // the refused whoami
				}
				p.noErrors()
				bytes, reqs := p.weight()
				t.Logf("%s at %d px: %.1f KB in %d requests", pg.name, width, bytes/1024, len(reqs))
				if bytes > MaxPageBytes {
					t.Errorf("%s transferred %.0f bytes (> %d): %v", pg.name, bytes, MaxPageBytes, reqs)
				}
				if w := eval[int](p, `document.documentElement.scrollWidth`); w > int(width) {
					t.Errorf("%s is %d px wide on a %d px screen", pg.name, w, width)
				}
				violations := eval[[]string](p, axe+`;
axe.run(document, {resultTypes: ['violations']}).then((r) => r.violations
  .filter((v) => v.impact === 'serious' || v.impact === 'critical')
  .map((v) => v.impact + ' ' + v.id + ': ' + v.help + ' at ' + v.nodes.map((n) => n.target.join(' ')).join(', ')))`)
				if len(violations) > 0 {
					t.Errorf("axe on %s at %d px:\n%s", pg.name, width, strings.Join(violations, "\n"))
				}
				if shots {
					png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
					if err != nil {
						t.Fatal(err)
					}
					dir := filepath.Join("..", "..", "docs", "screenshots")
					if err := os.MkdirAll(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.png", pg.name, width)), png, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// denyAll denies every call of token's namespace waiting for approval.
func denyAll(t testing.TB, f *fleet, token string) {
	st, body := f.call(t, token, "GET", "/api/approvals", nil)
	var list struct{ Approvals []struct{ ID string } }
	if err := json.Unmarshal(body, &list); st != 200 || err != nil {
		t.Errorf("list approvals: %d %s", st, body)
		return
	}
	for _, a := range list.Approvals {
		f.call(t, token, "POST", "/api/approvals/"+a.ID, map[string]string{"decision": "deny"})
	}
}

// weight is what the page transferred since it was opened, and the URLs
// it asked for.
func (p *page) weight() (float64, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes, append([]string(nil), p.reqs...)
}

// js quotes s as a JavaScript string.
func js(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
