package console_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestFleetCountsAreAdmins attacks the fleet page as a tenant watching
// another's activity: while namespace b's job runs, namespace a's view of
// the fleet moves with none of it (no busy slots, stream sizes, sessions or
// calls; the counts are marked hidden), while the admin token sees the busy
// slot and the streams' sizes.
func TestFleetCountsAreAdmins(t *testing.T) {
	t.Parallel()
	f := startFleet(t, testutil.ProcessRuntime(t), false)
	id := f.submit(t, tokB, map[string]any{"code": "import time\ntime.sleep(20)", "timeout": 30})
	get := func(token string) console.Fleet {
		st, body := f.call(t, token, http.MethodGet, "/api/console/fleet", nil)
		if st != http.StatusOK {
			t.Fatalf("fleet: %d %s", st, body)
		}
		var fl console.Fleet
		if err := json.Unmarshal(body, &fl); err != nil {
			t.Fatal(err)
		}
		return fl
	}
	busy := func(fl console.Fleet) (running int, msgs uint64) {
		for _, w := range fl.Workers {
			running += w.Running
		}
		for _, s := range fl.Streams {
			msgs += s.Messages
		}
		return running, msgs
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if running, msgs := busy(get(tokAdmin)); running > 0 && msgs > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin never saw b's job %s running", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fl := get(tokA)
	if running, msgs := busy(fl); running != 0 || msgs != 0 || !fl.CountsHidden {
		t.Fatalf("namespace a sees b's activity: %d running, %d stream messages, hidden %v", running, msgs, fl.CountsHidden)
	}
	if len(fl.Workers) == 0 || fl.Workers[0].Slots == 0 || len(fl.Streams) == 0 {
		t.Fatalf("namespace a's fleet page lost what it may see: %+v", fl)
	}
	if st, body := f.call(t, tokB, http.MethodPost, "/api/jobs/"+id+"/cancel", nil); st >= 300 {
		t.Logf("cancel: %d %s", st, body)
	}
}
