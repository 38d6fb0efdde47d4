package jobs

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestOrderAndCycles(t *testing.T) {
	// A chain long enough to break a recursive search, given backwards.
	const n = 20000
	var js []*Job
	for i := n - 1; i >= 0; i-- {
		j := &Job{ID: fmt.Sprintf("j%d", i)}
		if i > 0 {
			j.After = []string{fmt.Sprintf("j%d", i-1)}
		}
		js = append(js, j)
	}
	out, err := Order(js)
	if err != nil || len(out) != n {
		t.Fatalf("chain: %v %d", err, len(out))
	}
	for k, i := range out {
		if js[i].ID != fmt.Sprintf("j%d", k) {
			t.Fatalf("position %d holds %s", k, js[i].ID)
		}
	}
	// Parents outside the batch are not the batch's business.
	if _, err := Order([]*Job{{ID: "a", After: []string{"elsewhere"}}}); err != nil {
		t.Fatal(err)
	}
	_, err = Order([]*Job{{ID: "a", AfterAny: []string{"c"}}, {ID: "b", After: []string{"a"}}, {ID: "c", After: []string{"b"}}, {ID: "d"}})
	if err == nil || !strings.Contains(err.Error(), "a → c → b → a") {
		t.Fatalf("cycle: %v", err)
	}
}

func TestWaitingLifecycle(t *testing.T) {
	now := time.Now()
	spec := &Job{ID: "c", After: []string{"p1"}, AfterAny: []string{"p2"}}
	rec, _ := Apply(nil, Event{Job: "c", Kind: EventSubmitted, Spec: spec, At: now})
	if rec.Status != StatusWaiting {
		t.Fatalf("submitted child: %s", rec.Status)
	}
	if _, ch := Apply(&Record{Status: StatusQueued}, Event{Kind: EventReleased}); ch {
		t.Fatal("a queued job was released again")
	}
	rec, ch := Apply(rec, Event{Job: "c", Kind: EventReleased, At: now})
	if !ch || rec.Status != StatusQueued {
		t.Fatalf("released: %s", rec.Status)
	}
	ended := func(st Status) *Record { return &Record{Status: st} }
	for _, c := range []struct {
		parents map[string]*Record
		want    Readiness
	}{
		{map[string]*Record{}, NotReady},
		{map[string]*Record{"p1": ended(StatusSuccess)}, NotReady},
		{map[string]*Record{"p1": ended(StatusRunning), "p2": ended(StatusError)}, NotReady},
		{map[string]*Record{"p1": ended(StatusSuccess), "p2": ended(StatusError)}, Ready},
		{map[string]*Record{"p1": ended(StatusTimeout)}, Skip},
		{map[string]*Record{"p1": ended(StatusSkipped), "p2": ended(StatusSuccess)}, Skip},
	} {
		if got, why := spec.Ready(c.parents); got != c.want {
			t.Errorf("%v: %v (%s), want %v", c.parents, got, why, c.want)
		}
	}
	for _, bad := range []Job{
		{ID: "x", Code: "1", After: []string{"x"}},
		{ID: "x", Code: "1", After: []string{"p"}, AfterAny: []string{"p"}},
		{ID: "x", Code: "1", After: []string{"a b"}},
		{ID: "x", Code: "1", After: make([]string, 1001)},
	} {
		if err := bad.Normalize(DefaultLimits(), now); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
