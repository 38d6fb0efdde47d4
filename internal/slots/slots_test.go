package slots_test

import (
	"sync"
	"testing"

	"github.com/mcpexec/mcpexec/internal/slots"
)

// TestGreedyKeyLeavesOthersTheirs: one key takes what it may, and no more;
// another key still gets its slots; the overall bound holds; released slots
// come back once, however often release is called.
func TestGreedyKeyLeavesOthersTheirs(t *testing.T) {
	k := &slots.Keyed{Max: 3, Total: 5}
	var rel []func()
	for i := range 10 {
		r, ok := k.Take("greedy")
		if ok != (i < 3) {
			t.Fatalf("greedy take %d: %v", i, ok)
		}
		rel = append(rel, r)
	}
	for i := range 3 {
		if _, ok := k.Take("other"); ok != (i < 2) {
			t.Fatalf("other take %d: %v (total 5)", i, ok)
		}
	}
	rel[0]()
	rel[0]()
	if mine, all := k.InUse("greedy"); mine != 2 || all != 4 {
		t.Fatalf("after one release twice: greedy %d, all %d", mine, all)
	}
}

func TestConcurrentTakes(t *testing.T) {
	k := &slots.Keyed{Max: 10}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range 100 {
		wg.Go(func() {
			if _, ok := k.Take("a"); ok {
				mu.Lock()
				got++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got != 10 {
		t.Fatalf("%d of 100 concurrent takes got a slot, want 10", got)
	}
}
