package jobs_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// A job's record is the fold of its events: the state service applies them in
// the events stream's order, and a terminal record never changes again.
func ExampleApply() {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := &jobs.Job{ID: "j1", Code: "print(1)", Timeout: 30, MaxAttempts: 2}
	rec, _ := jobs.Apply(nil, jobs.Event{Job: "j1", Kind: jobs.EventSubmitted, Spec: spec, At: at})
	fmt.Println(rec.Status)
	rec, _ = jobs.Apply(rec, jobs.Event{Job: "j1", Kind: jobs.EventStarted, Attempt: 1, Worker: "w1", At: at})
	fmt.Println(rec.Status, rec.Worker)
	rec, _ = jobs.Apply(rec, jobs.Event{Job: "j1", Kind: jobs.EventFinished, Attempt: 1, At: at,
		Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "1\n"}})
	fmt.Println(rec.Status)
	// A late event of the same job changes nothing.
	_, changed := jobs.Apply(rec, jobs.Event{Job: "j1", Kind: jobs.EventCancelled, At: at})
	fmt.Println(changed)
	// Output:
	// queued
	// running w1
	// success
	// false
}

// Order puts a batch's parents before their children, or names a cycle.
func ExampleOrder() {
	batch := []*jobs.Job{
		{ID: "join", After: []string{"left", "right"}},
		{ID: "left", After: []string{"root"}},
		{ID: "right", After: []string{"root"}},
		{ID: "root"},
	}
	order, _ := jobs.Order(batch)
	var ids []string
	for _, i := range order {
		ids = append(ids, batch[i].ID)
	}
	fmt.Println(strings.Join(ids, " "))
	_, err := jobs.Order([]*jobs.Job{{ID: "a", After: []string{"b"}}, {ID: "b", After: []string{"a"}}})
	fmt.Println(err)
	// Output:
	// root left right join
	// invalid after: the jobs wait for each other in a cycle: a → b → a: remove one of these edges
}
