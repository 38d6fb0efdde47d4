package console_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/mcpexec/mcpexec/internal/testutil/chromiumtest"
)

// page drives one browser tab at the console of a fleet, collecting the
// page's console errors and the bytes it loads.
type page struct {
	t   testing.TB
	ctx context.Context
	url string

	mu     sync.Mutex // guards errors, bytes, reqs
	errors []string
	bytes  float64  // encoded bytes of the loads finished since reset
	reqs   []string // URLs requested since reset
}

func newPage(t testing.TB, base string) *page {
	t.Helper()
	p := &page{t: t, ctx: chromiumtest.New(t), url: base}
	err := chromedp.Listen(p.ctx, func(ev any) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			p.errors = append(p.errors, fmt.Sprintf("exception: %s at %s:%d", msg, d.URL, d.LineNumber))
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				p.errors = append(p.errors, "console."+string(e.Type)+": "+strings.Join(parts, " "))
			}
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError {
				p.errors = append(p.errors, "log: "+e.Entry.Text+" "+e.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			p.reqs = append(p.reqs, e.Request.URL)
		case *network.EventLoadingFinished:
			p.bytes += e.EncodedDataLength
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	p.do(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true})
		return err
	}))
	return p
}

// on makes t the test that p's failures fail (each subtest's own).
func (p *page) on(t testing.TB) *page {
	p.t = t
	return p
}

// do runs steps, failing the test after a minute.
func (p *page) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.t.Fatalf("browser: %v (page errors: %v)", err, p.takeErrors())
	}
}

// eval evaluates expr (a promise is awaited) into out.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("evaluate %.80q: %v", expr, err)
	}
	return v
}

// until waits (30 s) for the JavaScript expression to be truthy.
func (p *page) until(what, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 45*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(40*time.Second))); err != nil {
		dctx, dcancel := context.WithTimeout(p.ctx, 10*time.Second) // a wedged page must not hang the report
		defer dcancel()
		body, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`)) // for the message only
		p.t.Fatalf("waiting for %s (%s): %v\npage text:\n%s\npage errors: %v", what, expr, err, body, p.takeErrors())
	}
}

// open loads the console afresh at hash (e.g. "#/fleet"): a full load, so
// the bytes counted are the page's whole weight. setup, when given, runs
// first in a document of the console's origin (its session storage).
func (p *page) open(hash string, setup ...string) {
	p.t.Helper()
	p.do(chromedp.Navigate(p.url + "/healthz"))
	for _, s := range setup {
		p.do(chromedp.Evaluate[chromedp.Void](s))
	}
	p.mu.Lock()
	p.bytes, p.reqs = 0, nil
	p.mu.Unlock()
	p.do(chromedp.Navigate(p.url + "/ui/" + hash))
}

// hash moves within the loaded console.
func (p *page) hash(hash string) {
	p.t.Helper()
	p.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf("void (location.hash = %q)", hash)))
}

func (p *page) takeErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.errors
	p.errors = nil
	return e
}

// noErrors fails the test if the page logged errors since the last check.
func (p *page) noErrors() {
	p.t.Helper()
	if e := p.takeErrors(); len(e) > 0 {
		p.t.Errorf("console errors: %q", e)
	}
}

// signIn signs in with token through the form (signing out first).
func (p *page) signIn(token string) {
	p.t.Helper()
	p.open("#/jobs", `sessionStorage.clear()`)
	p.until("the sign-in form", `document.getElementById('token') !== null`)
	_ = p.takeErrors() // the refused whoami is logged as a failed load
	p.do(chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.CSS("form.signin button")))
	p.until("the jobs page", `document.getElementById('jobs-body') !== null && document.getElementById('live').textContent === 'live'`)
}

// chromedpClick clicks the first element that matches the CSS selector.
func chromedpClick(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Click(chromedp.CSS(sel))
}
