package console_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// fill writes n finished job records of namespace ns straight into the
// broker's state store (in transactions of 5,000), as a long-lived
// namespace would have them.
func fill(tb testing.TB, b *broker.Broker, ns string, n int) {
	tb.Helper()
	now := time.Now().Add(-time.Hour)
	var evs []jobs.Event
	for i := range n {
		id := jobs.ScopedID(ns, jobs.NewID())
		at := now.Add(time.Duration(i) * time.Millisecond)
		evs = append(evs,
			jobs.Event{Job: id, Kind: jobs.EventSubmitted, At: at, Spec: &jobs.Job{ID: id, Namespace: ns, Code: fmt.Sprintf("print(%d)", i), MaxAttempts: 1, SubmittedAt: at, Labels: map[string]string{"bulk": "yes"}}},
			jobs.Event{Job: id, Kind: jobs.EventStarted, At: at, Attempt: 1, Worker: "w"},
			jobs.Event{Job: id, Kind: jobs.EventFinished, At: at, Attempt: 1, Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: fmt.Sprintln(i), DurationMS: 3}})
		if len(evs) >= 15_000 || i == n-1 {
			if _, err := b.Store().ApplyEvents(evs, 0); err != nil {
				tb.Fatal(err)
			}
			evs = evs[:0]
		}
	}
}

// BenchmarkJobsPage100k times the jobs page's first render (a full load to
// the first page of rows, live) in a namespace of 100,000 jobs, next to one
// of 50, and checks that the page fetched one page of jobs, never all:
//
//	flock -o /tmp/mcpexec-heavy.lock go test -tags "$(make -s tags)" -run '^$' -bench JobsPage100k -benchtime 20x ./internal/console
func BenchmarkJobsPage100k(b *testing.B) {
	for _, n := range []int{50, 100_000} {
		b.Run(fmt.Sprint("jobs=", n), func(b *testing.B) { benchJobsPage(b, n) })
	}
}

func benchJobsPage(b *testing.B, n int) {
	f := startFleet(b, testutil.ProcessRuntime(b), false)
	start := time.Now()
	fill(b, f.b, "a", n)
	b.Logf("%d records written in %s", n, time.Since(start).Round(time.Millisecond))
	p := newPage(b, f.url)
	setup := `sessionStorage.setItem('mcpexec.token', ` + js(tokA) + `)`
	ready := `document.querySelectorAll('#jobs-body tr').length === 50 && document.getElementById('live').textContent === 'live'`
	p.open("#/jobs", setup)
	p.until("the first page", ready)
	b.ResetTimer()
	for range b.N {
		p.open("#/jobs", setup)
		p.until("the first page", ready)
	}
	b.StopTimer()
	_, reqs := p.weight()
	var lists []string
	for _, r := range reqs {
		if u, err := url.Parse(r); err == nil && u.Path == "/api/jobs" {
			lists = append(lists, u.RawQuery)
		}
	}
	if len(lists) != 1 || !strings.Contains(lists[0], "limit=50") || !strings.Contains(lists[0], "order=newest") {
		b.Fatalf("the page fetched %v, want one page of 50", lists)
	}
	if n > 50 { // the next page continues from the cursor
		p.do(chromedpClick("#more"))
		p.until("the second page", `document.querySelectorAll('#jobs-body tr').length === 100`)
	}
	p.noErrors()
}
