package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestConsole drives the console in headless Chromium against a fleet in
// this process (process sandboxes): the live jobs list, a job's output and
// proxy calls, retrying a dead letter, editing memory that a job then
// reads, the fleet and charts pages, keyboard use, tenancy and refusal
// without a token.
func TestConsole(t *testing.T) {
	f := startFleet(t, newFailOnce(testutil.ProcessRuntime(t)), true)
	p := newPage(t, f.url)
	var echoJob string

	t.Run("RefusedWithoutToken", func(t *testing.T) {
		p.on(t)
		for _, path := range []string{"/api/jobs", "/api/console/whoami", "/api/console/memory", "/api/console/fleet", "/api/events"} {
			if st, body := f.call(t, "", "GET", path, nil); st != http.StatusUnauthorized {
				t.Errorf("GET %s without a token: %d %s", path, st, body)
			}
		}
		if st, _ := f.call(t, "not-a-token-at-all", "GET", "/api/console/whoami", nil); st != http.StatusUnauthorized {
			t.Errorf("a wrong token: %d", st)
		}
		res, err := http.Get(f.url + "/ui/")
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close() // only the headers matter
		if csp := res.Header.Get("Content-Security-Policy"); res.StatusCode != 200 || csp != console.CSP || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET /ui/: %d, CSP %q", res.StatusCode, csp)
		}
		p.open("#/jobs")
		p.until("the sign-in form", `document.getElementById('token') !== null && document.getElementById('jobs') === null`)
		_ = p.takeErrors() // the refused whoami is logged as a failed load
	})

	t.Run("LiveList", func(t *testing.T) {
		p.on(t)
		p.signIn(tokA)
		echoJob = f.submit(t, tokA, map[string]any{"code": "r = await mcp_ts.echo(text='hello from the console test')\nprint('echoed:', r)",
			"servers": []string{"ts"}, "labels": map[string]string{"suite": "console"}})
		// The row appears and turns success without a reload.
		p.until("the new job's row", `document.querySelector('tr[data-id="`+echoJob+`"]') !== null`)
		p.until("the job's success", `document.querySelector('tr[data-id="`+echoJob+`"] .status').textContent === 'success'`)
		// Filters: by label, and by status through the form.
		f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "print('unlabelled')"}))
		p.hash("#/jobs?label=suite%3Dconsole")
		p.until("the label filter", `document.querySelectorAll('#jobs-body tr').length === 1 && document.querySelector('tr[data-id="`+echoJob+`"]') !== null`)
		p.hash("#/jobs")
		p.until("both jobs", `document.querySelectorAll('#jobs-body tr').length === 2`)
		p.do(chromedp.SetValue(chromedp.ID("f-status"), "error"), chromedp.Click(chromedp.CSS("form.filters button")))
		p.until("the status filter", `location.hash === '#/jobs?status=error' && document.getElementById('count').textContent === '0 jobs shown'`)
		p.hash("#/jobs")
		p.until("the jobs", `document.querySelector('tr[data-id="`+echoJob+`"] a') !== null`)
		p.noErrors()
	})

	t.Run("JobPage", func(t *testing.T) {
		p.on(t)
		p.do(chromedp.Click(chromedp.CSS(`tr[data-id="` + echoJob + `"] a`)))
		p.until("the job's output", `(document.getElementById('stdout') || {}).textContent === 'echoed: hello from the console test\n'`)
		p.until("the proxy call in the timeline", `document.getElementById('timeline').textContent.includes('call ts.echo')`)
		rec := f.wait(t, tokA, echoJob)
		timeline := eval[string](p, `document.getElementById('timeline').innerText`)
		for _, want := range []string{"submitted", "taken from the queue", "sandbox ready", "started", "call ts.echo", "ok", "finished: success"} {
			if !strings.Contains(timeline, want) {
				t.Errorf("the timeline lacks %q:\n%s", want, timeline)
			}
		}
		if got := eval[string](p, `document.getElementById('trace-id').textContent`); got != rec.TraceID || len(got) != 32 {
			t.Errorf("trace id %q, record's %q", got, rec.TraceID)
		}
		if n := eval[int](p, `document.querySelectorAll('.hl .k').length`); n == 0 {
			t.Error("the code is not highlighted")
		}
		p.do(chromedp.Click(chromedp.ID("copy-curl")))
		curl := eval[string](p, `document.getElementById('curl').textContent`)
		if !strings.Contains(curl, f.url+"/api/jobs") || !strings.Contains(curl, "$MCPEXEC_TOKEN") || strings.Contains(curl, tokA) {
			t.Errorf("copy as curl: %s", curl)
		}
		// The timeline's JSON answer too.
		st, body := f.call(t, tokA, "GET", "/api/console/jobs/"+echoJob+"/timeline", nil)
		var tl console.Timeline
		if err := json.Unmarshal(body, &tl); st != 200 || err != nil || len(tl.Spans) == 0 {
			t.Fatalf("timeline: %d %s", st, body)
		}
		p.noErrors()
	})

	t.Run("RetryDeadLetter", func(t *testing.T) {
		p.on(t)
		id := f.submit(t, tokA, map[string]any{"code": "#fail-once\nprint('second try')"})
		if rec := f.wait(t, tokA, id); !rec.DeadLetter() {
			t.Fatalf("want a dead letter, got %+v", rec)
		}
		p.hash("#/job/" + id)
		p.until("the retry button", `document.getElementById('retry') !== null && document.querySelector('h1').textContent === 'Job `+id+`'`)
		p.do(chromedp.Click(chromedp.ID("retry")))
		p.until("the re-run's page", `location.hash !== '#/job/`+id+`' && document.body.textContent.includes('Re-run of')`)
		p.until("the re-run's output", `(document.getElementById('stdout') || {}).textContent === 'second try\n'`)
		p.noErrors()
	})

	t.Run("Pictures", func(t *testing.T) {
		p.on(t)
		// A 3x2 PNG written by the code, and a CSV: the job page shows the
		// picture (fetched with the token) and offers both for download.
		code := `import os, struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
raw = b"".join(b"\x00" + b"\xff\x00\x00" * 3 for _ in range(2))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
os.makedirs("out", exist_ok=True)
open("out/chart.png", "wb").write(png)
open("out/table.csv", "w").write("a,b\n1,2\n")`
		id := f.submit(t, tokA, map[string]any{"code": code})
		if rec := f.wait(t, tokA, id); rec.Result == nil || len(rec.Result.Files) != 2 {
			t.Fatalf("job %+v", rec.Result)
		}
		p.hash("#/job/" + id)
		p.until("the picture", `(() => { const i = document.querySelector('#files img[data-file="chart.png"]'); return i !== null && i.complete && i.naturalWidth === 3 && i.naturalHeight === 2; })()`)
		p.until("the downloads", `document.querySelectorAll('#files button[data-file]').length === 2`)
		p.noErrors()
		if st, body := f.call(t, tokB, "GET", "/api/jobs/"+id+"/files/chart.png", nil); st != http.StatusNotFound {
			t.Errorf("b reads a's picture: %d %s", st, body)
		}
	})

	t.Run("Memory", func(t *testing.T) {
		p.on(t)
		if rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "save_memory('greeting', 'hello')"})); rec.Status != jobs.StatusSuccess {
			t.Fatalf("save: %+v", rec.Result)
		}
		p.hash("#/memory")
		p.do(chromedp.Click(chromedp.CSS(`button[data-key="greeting"]`)))
		p.until("the editor", `document.getElementById('m-value') !== null && document.getElementById('m-value').value === '"hello"'`)
		// Someone else writes the key meanwhile: the stale save is refused.
		if st, body := f.call(t, tokA, "PUT", "/api/console/memory/entry", map[string]any{"key": "greeting", "value": "behind your back"}); st != 200 {
			t.Fatalf("put: %d %s", st, body)
		}
		p.do(chromedp.SetValue(chromedp.ID("m-value"), `"edited in the console"`), chromedp.Click(chromedp.ID("m-save")))
		p.until("the conflict", `document.getElementById('m-msg').textContent.includes('Not saved')`)
		p.do(chromedp.Click(chromedp.CSS(`button[data-key="greeting"]`)))
		p.until("the fresh value", `document.getElementById('m-value').value === '"behind your back"'`)
		p.do(chromedp.SetValue(chromedp.ID("m-value"), `"edited in the console"`), chromedp.Click(chromedp.ID("m-save")))
		p.until("the save", `document.getElementById('m-msg').textContent.includes('Saved version')`)
		rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "print(load_memory('greeting'))"}))
		if rec.Result == nil || rec.Result.Stdout != "edited in the console\n" {
			t.Fatalf("the job read %+v", rec.Result)
		}
		// Delete (two presses), then the key is gone.
		p.hash("#/jobs")
		p.until("the jobs page", `document.getElementById('jobs-body') !== null`)
		p.hash("#/memory")
		p.until("the memory page", `document.querySelector('button[data-key="greeting"]') !== null`)
		p.do(chromedp.Click(chromedp.CSS(`button[data-key="greeting"]`)))
		p.until("the editor", `document.getElementById('m-delete') !== null`)
		p.do(chromedp.Click(chromedp.ID("m-delete")), chromedp.Click(chromedp.ID("m-delete")))
		p.until("the deletion", `document.getElementById('editor').textContent.includes('Deleted greeting') && document.querySelector('button[data-key="greeting"]') === null`)
		if st, body := f.call(t, tokA, "GET", "/api/console/memory/entry?key=greeting", nil); st != http.StatusNotFound {
			t.Errorf("deleted key: %d %s", st, body)
		}
		_ = p.takeErrors() // the refused save is logged as a failed load (409)
	})

	t.Run("SessionsAndTools", func(t *testing.T) {
		p.on(t)
		if rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "x = 41", "session": "s1"})); rec.Status != jobs.StatusSuccess {
			t.Fatalf("session job: %+v", rec.Result)
		}
		if rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "def twice(n):\n    return 2 * n\n\nsave_tool(twice)"})); rec.Status != jobs.StatusSuccess {
			t.Fatalf("save_tool job: %+v", rec.Result)
		}
		p.hash("#/sessions")
		p.until("the live session and the saved tool", `(document.querySelector('tr[data-name="s1"] .state') || {}).textContent === 'live' && document.querySelector('details[data-tool="twice"]') !== null`)
		p.do(chromedp.Click(chromedp.CSS(`button[data-session="s1"]`)))
		p.until("the ended session", `document.getElementById('s-msg').textContent.includes('Ended session s1')`)
		rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "print(x)", "session": "s1"}))
		if rec.Status == jobs.StatusSuccess {
			t.Fatalf("the ended session ran on: %+v", rec.Result)
		}
		p.noErrors()
	})

	t.Run("Approvals", func(t *testing.T) {
		p.on(t)
		p.hash("#/jobs")
		count := `document.getElementById('approvals-count').textContent`
		p.until("no call waiting in the header", count+` === '0'`)
		id := f.submit(t, tokA, map[string]any{"code": "r = await mcp_ts.add(a=2, b=3)\nprint('sum', r['sum'])", "servers": []string{"ts"}})
		// The header's count goes up live, whatever the page.
		p.until("one call waiting in the header", count+` === '1'`)
		p.hash("#/approvals")
		card := func(job string) string {
			return `document.querySelector('article.approval:has(a[href="#/job/` + job + `"])')`
		}
		p.until("the call's card with its job's code", card(id)+` !== null && `+card(id)+`.querySelector('.tool').textContent === 'ts/add' && `+
			card(id)+`.querySelector('.job-code').textContent.includes('mcp_ts.add(a=2, b=3)')`)
		if got := eval[string](p, card(id)+`.querySelector('pre.args').textContent`); got != "{\n  \"a\": 2,\n  \"b\": 3\n}" {
			t.Errorf("the arguments shown: %q", got)
		}
		// Another namespace's token neither sees the call nor answers it.
		apID := eval[string](p, card(id)+`.dataset.approval`)
		if st, body := f.call(t, tokB, "GET", "/api/approvals", nil); st != http.StatusOK || strings.TrimSpace(string(body)) != `{"approvals":[]}` {
			t.Errorf("b lists a's approvals: %d %s", st, body)
		}
		if st, body := f.call(t, tokB, "POST", "/api/approvals/"+apID, map[string]any{"decision": "approve", "scope": "namespace", "minutes": 60}); st != http.StatusNotFound {
			t.Errorf("b approves a's call: %d %s", st, body)
		}
		p.do(chromedp.SendKeys(chromedp.CSS(`article[data-approval="`+apID+`"] .reason`), "looks fine"), chromedpClick(`article[data-approval="`+apID+`"] .approve`))
		p.until("the card gone and the count back to none", card(id)+` === null && `+count+` === '0' && document.getElementById('approvals-msg').textContent.includes('Approved ts/add')`)
		if rec := f.wait(t, tokA, id); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "sum 5\n" {
			t.Fatalf("approved job: %s %+v", rec.Status, rec.Result)
		}
		// The job's page says who allowed the call.
		p.hash("#/job/" + id)
		p.until("the decision in the timeline", `(document.getElementById('timeline') || {textContent: ''}).textContent.includes('allowed by a jobs API caller of namespace "a"')`)
		p.hash("#/approvals")
		p.until("the approvals page", `document.getElementById('approvals-live') !== null`)

		// Denied, with a reason: the code gets MCPError and goes on.
		id = f.submit(t, tokA, map[string]any{"code": "try:\n    await mcp_ts.add(a=1, b=1)\nexcept MCPError as e:\n    print('MCPError:', e)", "servers": []string{"ts"}})
		p.until("the second call's card", card(id)+` !== null && `+count+` === '1'`)
		apID = eval[string](p, card(id)+`.dataset.approval`)
		p.do(chromedp.SendKeys(chromedp.CSS(`article[data-approval="`+apID+`"] .reason`), "not now"), chromedpClick(`article[data-approval="`+apID+`"] .deny`))
		rec := f.wait(t, tokA, id)
		if want := `MCPError: ts/add was denied by a jobs API caller of namespace "a" (approval ` + apID + `, tool rule "ts/add"): not now`; rec.Status != jobs.StatusSuccess || strings.TrimSpace(rec.Result.Stdout) != want {
			t.Fatalf("denied job: %s %q, want %q", rec.Status, rec.Result.Stdout, want)
		}
		p.until("no card left", `document.querySelectorAll('article.approval').length === 0 && `+count+` === '0'`)

		// Approved for the job: its later calls of the tool ask nobody.
		id = f.submit(t, tokA, map[string]any{"code": "for i in range(3):\n    print((await mcp_ts.add(a=i, b=10))['sum'])", "servers": []string{"ts"}})
		p.until("the loop's card", card(id)+` !== null`)
		apID = eval[string](p, card(id)+`.dataset.approval`)
		sel := `article[data-approval="` + apID + `"]`
		p.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('`+sel+` .scope'); s.value = 'job'; s.dispatchEvent(new Event('change')); })()`),
			chromedpClick(sel+` .approve`))
		if rec := f.wait(t, tokA, id); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "10\n11\n12\n" {
			t.Fatalf("job-approved loop: %s %+v", rec.Status, rec.Result)
		}
		p.until("the job's grant", `document.querySelectorAll('#grants-table tbody tr').length === 1 && document.getElementById('grants-table').textContent.includes('job `+id+`')`)

		// Approved for the namespace for 5 minutes, then revoked.
		id = f.submit(t, tokA, map[string]any{"code": "print((await mcp_ts.add(a=5, b=5))['sum'])", "servers": []string{"ts"}})
		p.until("the next card", card(id)+` !== null`)
		apID = eval[string](p, card(id)+`.dataset.approval`)
		sel = `article[data-approval="` + apID + `"]`
		p.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('` + sel + ` .scope'); s.value = 'namespace'; s.dispatchEvent(new Event('change')); })()`))
		if dis := eval[bool](p, `document.querySelector('`+sel+` .minutes').disabled`); dis {
			t.Error("the minutes field stays disabled for a namespace grant")
		}
		p.do(chromedp.SetValue(chromedp.CSS(sel+` .minutes`), "5"), chromedpClick(sel+` .approve`))
		if rec := f.wait(t, tokA, id); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "10\n" {
			t.Fatalf("namespace-approved job: %s %+v", rec.Status, rec.Result)
		}
		// While the grant holds, another job's call asks nobody.
		if rec := f.wait(t, tokA, f.submit(t, tokA, map[string]any{"code": "print((await mcp_ts.add(a=1, b=2))['sum'])", "servers": []string{"ts"}})); rec.Result == nil || rec.Result.Stdout != "3\n" {
			t.Fatalf("a job under the namespace grant: %s %+v", rec.Status, rec.Result)
		}
		nsRow := `document.querySelector('#grants-table tr[data-scope="namespace"]')`
		p.until("the namespace's grant", nsRow+` !== null && document.querySelectorAll('#grants-table tbody tr').length === 2`)
		p.do(chromedp.Evaluate[chromedp.Void](nsRow + `.querySelector('button.revoke').click()`))
		p.until("the grant revoked", `document.querySelectorAll('#grants-table tbody tr').length === 1`)
		st, body := f.call(t, tokA, "GET", "/api/approvals/grants", nil)
		if st != http.StatusOK || strings.Count(string(body), `"scope":"job"`) != 1 || strings.Contains(string(body), `"scope":"namespace"`) {
			t.Errorf("grants after the revocation: %d %s", st, body)
		}
		p.noErrors()
	})

	t.Run("Keyboard", func(t *testing.T) {
		p.on(t)
		p.open("#/jobs")
		p.until("the jobs", `document.querySelector('tr[data-id="`+echoJob+`"] a') !== null`)
		p.do(chromedp.KeyEvent("\t"))
		if got := eval[string](p, `document.activeElement.className`); got != "skip" {
			t.Errorf("the first Tab focuses %q, want the skip link", got)
		}
		p.do(chromedp.Focus(chromedp.CSS(`tr[data-id="`+echoJob+`"] a`)), chromedp.KeyEvent("\r"))
		p.until("the job opened from the keyboard", `location.hash === '#/job/`+echoJob+`' && document.getElementById('stdout') !== null`)
		p.noErrors()
	})

	t.Run("FleetAndCharts", func(t *testing.T) {
		p.on(t)
		other := testutil.Worker(t, f.b, testutil.ProcessRuntime(t), worker.DefaultConfig("short-lived-worker"))
		p.hash("#/fleet")
		row := func(id string) string {
			return `(document.querySelector('#workers tr[data-id="` + id + `"]') || {textContent: ''}).textContent`
		}
		p.until("the workers", row(f.workerID)+`.includes('healthy') && `+row("short-lived-worker")+`.includes('healthy')`)
		// Every front-end of the fleet answers, this one marked.
		fe2 := testutil.FrontendWith(t, f.b, frontend.Config{ID: "other-fe"})
		feRow := func(id string) string {
			return `(document.querySelector('#frontends tr[data-id="` + id + `"]') || {textContent: ''}).textContent`
		}
		p.until("both front-ends", feRow("other-fe")+`.includes('answering') && `+feRow("console-fe")+`.includes('this one')`)
		if got := eval[string](p, feRow("console-fe")); !strings.Contains(got, "ts (") {
			t.Errorf("this front-end's row: %s", got)
		}
		if got := eval[string](p, `document.getElementById('streams').textContent`); !strings.Contains(got, "MCPEXEC_JOBS") || !strings.Contains(got, "MCPEXEC_MEMORY") {
			t.Errorf("streams: %s", got)
		}
		if n := eval[int](p, `document.querySelectorAll('#brokers tbody tr').length`); n != 1 {
			t.Errorf("%d brokers", n)
		}
		// A worker or front-end that stops answering turns stale (after 1 s here).
		other.Stop()
		fe2.Stop()
		time.Sleep(1100 * time.Millisecond)
		p.hash("#/jobs")
		p.hash("#/fleet")
		p.until("the stale worker", row("short-lived-worker")+`.includes('stale') && `+row(f.workerID)+`.includes('healthy')`)
		p.until("the stale front-end", feRow("other-fe")+`.includes('stale') && `+feRow("console-fe")+`.includes('answering')`)
		p.hash("#/charts")
		p.until("three charts with samples", `document.querySelectorAll('figure.chartbox svg').length === 3`)
		p.noErrors()
	})

	t.Run("OtherNamespace", func(t *testing.T) {
		p.on(t)
		p.signIn(tokB)
		p.until("an empty list", `document.getElementById('count').textContent === '0 jobs shown'`)
		if n := eval[int](p, `document.querySelectorAll('#jobs-body tr').length`); n != 0 {
			t.Errorf("namespace b sees %d jobs", n)
		}
		for _, path := range []string{"/api/jobs/" + echoJob, "/api/console/jobs/" + echoJob + "/timeline"} {
			if st, body := f.call(t, tokB, "GET", path, nil); st != http.StatusNotFound {
				t.Errorf("b reads a's %s: %d %s", path, st, body)
			}
		}
		if st, body := f.call(t, tokB, "GET", "/api/console/memory/entry?key=greeting", nil); st != http.StatusNotFound {
			t.Errorf("b reads a's memory: %d %s", st, body)
		}
		// A namespace header from a tenant's token changes nothing.
		p.hash("#/job/" + echoJob)
		p.until("the refusal", `document.body.textContent.includes('no job with id')`)
		_ = p.takeErrors() // the refused read is logged as a failed load (404)
	})

	t.Run("Admin", func(t *testing.T) {
		p.on(t)
		p.signIn(tokAdmin)
		p.do(chromedp.SetValue(chromedp.ID("ns"), "a"), chromedp.Click(chromedp.CSS("form.nsform button")))
		p.until("namespace a's job", `document.querySelector('tr[data-id="`+echoJob+`"]') !== null`)
		st, body := f.call(t, tokAdmin, "GET", "/api/console/whoami", nil)
		if st != 200 || !strings.Contains(string(body), `"admin":true`) {
			t.Errorf("whoami: %d %s", st, body)
		}
		p.noErrors()
	})
}
