package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// incrementCode is every job's code: one update_memory increment of the
// shared counter through the real runner, printing the value it wrote.
const incrementCode = "n = update_memory('counter', lambda v: (v or 0) + 1)\nprint(n)"

// op is one submission of the history: a job id, the fault window it was
// invoked in, and whether the front-end acknowledged it (2xx with the
// record), after how many tries.
type op struct {
	id     string
	window int
	start  time.Time
	acked  bool
	tries  int
}

// history records what the clients did and the windows of the schedule.
type history struct {
	mu      sync.Mutex // guards the fields below
	ops     []*op
	window  int             // the fault window now (0: none yet)
	names   []string        // each window's fault, by index
	refusal []time.Duration // each window's longest submission (refused, or held, until acknowledged or given up)
}

func newHistory() *history { return &history{names: []string{"warm-up"}, refusal: []time.Duration{0}} }

// open starts a window for fault name; ops invoked from now on belong to it.
func (h *history) open(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names = append(h.names, name)
	h.refusal = append(h.refusal, 0)
	h.window = len(h.names) - 1
}

func (h *history) begin(id string) *op {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := &op{id: id, window: h.window, start: time.Now()}
	h.ops = append(h.ops, o)
	return o
}

// refused notes that a client's submission went d without an acknowledgement.
func (h *history) refused(window int, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refusal[window] = max(h.refusal[window], d)
}

func (h *history) finish(o *op, acked bool, tries int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o.acked, o.tries = acked, tries
}

// client submits jobs one after another through the front-ends' jobs API
// until stop, retrying a refused submission with the same id (the API is
// idempotent) for up to opLimit, then giving it up.
func client(ctx context.Context, h *history, name string, urls func() []string, opLimit time.Duration) {
	for n := 0; ctx.Err() == nil; n++ {
		o := h.begin(fmt.Sprintf("%s-%04d", name, n))
		acked, tries := false, 0
		for deadline := time.Now().Add(opLimit); !acked && time.Now().Before(deadline); tries++ {
			us := urls()
			if len(us) == 0 {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			status, _ := apiDo(http.MethodPost, us[(n+tries)%len(us)]+"/api/jobs",
				map[string]any{"id": o.id, "code": incrementCode, "timeout": 60, "max_attempts": 3}, 10*time.Second)
			if status == http.StatusCreated || status == http.StatusOK {
				acked = true
				break
			}
			if ctx.Err() != nil && tries > 0 {
				break
			}
			time.Sleep(150 * time.Millisecond)
		}
		// The time the client went without an answer: refused, or held by
		// a front-end waiting for the cluster.
		h.refused(o.window, time.Since(o.start))
		h.finish(o, acked, tries)
		if acked {
			// A client waits for its job's result (a while) before the next:
			// the load follows what the workers run.
			waitResult(ctx, urls, o.id, 10*time.Second)
		}
	}
}

// waitResult waits up to limit for job id to reach a terminal status.
func waitResult(ctx context.Context, urls func() []string, id string, limit time.Duration) {
	for deadline := time.Now().Add(limit); ctx.Err() == nil && time.Now().Before(deadline); {
		for _, u := range urls() {
			status, body := apiDo(http.MethodGet, u+"/api/jobs/"+id+"/wait?timeout=2s", nil, 5*time.Second)
			var rec jobs.Record
			if status == http.StatusOK && json.Unmarshal(body, &rec) == nil && rec.Status.Terminal() {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func apiDo(method, url string, body any, timeout time.Duration) (int, []byte) {
	return testutil.APIDo(token, method, url, body, timeout)
}

// row is the result of one fault window, as Jepsen reports one.
type row struct {
	fault      string
	attempted  int
	acked      int
	lost       int
	duplicated int
	refusal    time.Duration
}

// verdict is what the checker found: a row per window, and every anomaly.
type verdict struct {
	rows      []row
	lost      []string // ids of the acknowledged jobs lost
	problems  []string
	counter   int // the final value of the shared counter
	successes int // jobs whose increment was acknowledged (success)
	extra     int // increments no success explains (ran twice, or failed after)
	// byWorker counts the jobs each worker recorded an outcome of.
	byWorker map[string]int
}

func (v *verdict) problem(format string, args ...any) {
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
}

// table prints the verdict as a Jepsen-style results table.
func (v *verdict) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-26s %9s %6s %5s %10s %10s\n", "fault", "attempted", "acked", "lost", "duplicated", "unanswered")
	for _, r := range v.rows {
		fmt.Fprintf(&b, "%-26s %9d %6d %5d %10d %10s\n", r.fault, r.attempted, r.acked, r.lost, r.duplicated, r.refusal.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, "counter %d, acknowledged increments %d, increments of unacknowledged attempts %d\n", v.counter, v.successes, v.extra)
	fmt.Fprintf(&b, "outcomes recorded by worker: %v\n", v.byWorker)
	return b.String()
}

// records is the final read of the history: each job's record through
// every front-end (nil where it has none).
type records map[string][]*jobs.Record

// check verifies the history against the final reads and the counter:
//   - every acknowledged submission has a record with a terminal status;
//   - the front-ends agree on each job's outcome (no job recorded two ways);
//   - the values the successful jobs printed are distinct (no two
//     increments saw the same counter: compare-and-set held), and none
//     exceeds the counter;
//   - the counter is at least the number of acknowledged increments and at
//     most that plus the attempts that ended otherwise (a job killed after
//     its increment and run again increments twice: at-least-once).
func check(h *history, recs records, counter int, counterErr error) *verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := &verdict{counter: counter, byWorker: map[string]int{}}
	rows := make([]row, len(h.names))
	for i, n := range h.names {
		rows[i] = row{fault: n, refusal: h.refusal[i]}
	}
	seen := map[int]string{}
	for _, o := range h.ops {
		r := &rows[o.window]
		r.attempted++
		if o.acked {
			r.acked++
		}
		got := recs[o.id]
		var first *jobs.Record
		for _, rec := range got {
			if rec == nil {
				continue
			}
			if first == nil {
				first = rec
				if rec.Result != nil && rec.Result.Worker != "" {
					v.byWorker[rec.Result.Worker]++
				}
			} else if rec.Status != first.Status || rec.Attempt != first.Attempt || stdout(rec) != stdout(first) {
				v.problem("job %s recorded two ways: %s attempt %d %q and %s attempt %d %q", o.id, first.Status, first.Attempt, stdout(first), rec.Status, rec.Attempt, stdout(rec))
				r.duplicated++
			}
		}
		switch {
		case o.acked && (first == nil || !first.Status.Terminal()):
			r.lost++
			status := "no record"
			if first != nil {
				status = string(first.Status)
			}
			v.problem("job %s was acknowledged (window %s, after %d tries) and is lost: %s", o.id, h.names[o.window], o.tries, status)
			v.lost = append(v.lost, o.id)
			continue
		case first == nil:
			continue
		case !first.Status.Terminal():
			v.extra += first.Job.MaxAttempts // it may still run
			continue
		}
		if first.Attempt > 1 {
			v.extra += first.Attempt - 1
		}
		if first.Status != jobs.StatusSuccess {
			v.extra++
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(stdout(first)))
		if err != nil {
			v.problem("job %s succeeded and printed %q, not the counter", o.id, stdout(first))
			continue
		}
		v.successes++
		if other, ok := seen[n]; ok {
			v.problem("jobs %s and %s both wrote counter value %d: an increment was lost", other, o.id, n)
			r.duplicated++
		}
		seen[n] = o.id
		if n > counter {
			r.lost++
			v.problem("job %s's acknowledged increment wrote %d, and the counter is %d: it was lost", o.id, n, counter)
		}
	}
	switch {
	case counterErr != nil:
		v.problem("read the counter: %v", counterErr)
	case counter < v.successes:
		v.problem("the counter is %d after %d acknowledged increments: %d lost", counter, v.successes, v.successes-counter)
	case counter > v.successes+v.extra:
		// The values no success printed: the increments counted twice
		// (the job that printed the next one made them, or ran twice).
		var gaps []string
		for n := 1; n <= counter; n++ {
			if _, ok := seen[n]; !ok {
				gaps = append(gaps, fmt.Sprintf("%d (next printed by %s)", n, seen[n+1]))
			}
		}
		v.problem("the counter is %d after %d acknowledged increments and %d other attempts: it counted some twice; values no job printed: %s",
			counter, v.successes, v.extra, strings.Join(gaps, ", "))
	}
	v.rows = rows
	return v
}

func stdout(r *jobs.Record) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Stdout
}

// readAll reads every job of the history through every front-end, waiting
// up to limit for the acknowledged ones, and every one with a record, to
// reach a terminal status.
func readAll(h *history, urls []string, limit time.Duration) records {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	recs := records{}
	deadline := time.Now().Add(limit)
	for _, o := range ops {
		for {
			got := make([]*jobs.Record, len(urls))
			done := true
			for i, u := range urls {
				status, body := apiDo(http.MethodGet, u+"/api/jobs/"+o.id, nil, 5*time.Second)
				var rec jobs.Record
				if status == http.StatusOK && json.Unmarshal(body, &rec) == nil {
					got[i] = &rec
				}
				if (o.acked && got[i] == nil) || (got[i] != nil && !got[i].Status.Terminal()) {
					done = false
				}
			}
			recs[o.id] = got
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return recs
}
