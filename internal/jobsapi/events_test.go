package jobsapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
)

// sse is one open GET /api/events.
type sse struct {
	resp   *http.Response
	sc     *bufio.Scanner
	cancel context.CancelFunc
}

func openEvents(t *testing.T, e env, token, query, lastID string) *sse {
	t.Helper()
	// Bounded: a lost event must fail the test that waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/api/events"+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		_ = resp.Body.Close() // the test fails below: nothing else to report
		cancel()
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &sse{resp: resp, sc: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	return s
}

func (s *sse) close() {
	s.cancel()
	_ = s.resp.Body.Close() // read or abandoned: nothing to report
}

// next returns the next event (skipping comments), with its SSE id.
func (s *sse) next(t *testing.T) (string, frontend.JobEvent) {
	t.Helper()
	var id, data string
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "" && data != "":
			var ev frontend.JobEvent
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("event data %q: %v", data, err)
			}
			return id, ev
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		}
	}
	t.Fatalf("event stream ended: %v", s.sc.Err())
	return "", frontend.JobEvent{}
}

// TestEventsResume: a client that disconnects and resumes with Last-Event-ID
// misses no event of its filter, and sees no other namespace's.
func TestEventsResume(t *testing.T) {
	e := workflowEnv(t)
	first := openEvents(t, e, "tok-a", "?workflow=w1", "")
	other := openEvents(t, e, "tok-b", "", "")
	submit := func(tok, id string, n int) {
		req := jobsapi.WorkflowRequest{ID: id}
		for i := range n {
			req.Jobs = append(req.Jobs, jobsapi.JobRequest{ID: fmt.Sprintf("%s-%d", id, i), Code: "sleep 10ms"})
			if i > 0 {
				req.Jobs[i].After = []string{fmt.Sprintf("%s-%d", id, i-1)}
			}
		}
		if code, body := e.call(t, tok, "POST", "/api/workflows", req); code != http.StatusCreated {
			t.Fatalf("%d %s", code, body)
		}
	}
	submit("tok-a", "w1", 3)
	submit("tok-b", "wb", 3)
	// 3 jobs: submitted, released (2), started, finished: 11 events. Read 4.
	var got []uint64
	lastID := ""
	for range 4 {
		id, ev := first.next(t)
		if !strings.HasPrefix(ev.Job, "w1-") || ev.Labels["workflow"] != "w1" || strconv.FormatUint(ev.Seq, 10) != id {
			t.Fatalf("event %s %+v", id, ev)
		}
		got, lastID = append(got, ev.Seq), id
	}
	first.close()
	submit("tok-a", "w2", 2) // not in the filter
	resumed := openEvents(t, e, "tok-a", "?workflow=w1", lastID)
	for len(got) < 11 {
		_, ev := resumed.next(t)
		got = append(got, ev.Seq)
	}
	// Everything of w1, read from the oldest event kept, is what the two
	// connections saw together.
	all := openEvents(t, e, "tok-a", "?workflow=w1&after=0", "")
	var want []uint64
	kinds := map[string]int{}
	for len(want) < 11 {
		_, ev := all.next(t)
		want = append(want, ev.Seq)
		kinds[string(ev.Kind)+" "+string(ev.Status)]++
	}
	if !slices.Equal(got, want) {
		t.Fatalf("resumed stream saw %v, the events are %v", got, want)
	}
	if kinds["submitted queued"] != 1 || kinds["submitted waiting"] != 2 || kinds["released queued"] != 2 || kinds["finished success"] != 3 {
		t.Fatalf("kinds %v", kinds)
	}
	// Namespace b's stream carries b's jobs only.
	for range 11 {
		if _, ev := other.next(t); !strings.HasPrefix(ev.Job, "wb-") {
			t.Fatalf("b saw %+v", ev)
		}
	}
	// Bad requests say what is wrong.
	for _, c := range []struct{ query, lastID, contains string }{
		{"", "abc", "must be a whole number"},
		{"?label=nokey", "", "KEY=VALUE"},
		{"?workflow=a%20b", "", "not a workflow id"},
	} {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/api/events"+c.query, nil)
		req.Header.Set("Authorization", "Bearer tok-a")
		if c.lastID != "" {
			req.Header.Set("Last-Event-ID", c.lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body jobsapi.ErrorResponse
		_ = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close() // read or abandoned: nothing to report
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.Error.Message, c.contains) {
			t.Errorf("%s %s: %d %+v", c.query, c.lastID, resp.StatusCode, body)
		}
	}
}

// TestGreedyTenantCannotTakeEveryStream: namespace a opens event streams
// until it is refused (429, its own cap, well below the front-end's), and
// namespace b still opens one; once a closes one, a may open one again.
func TestGreedyTenantCannotTakeEveryStream(t *testing.T) {
	t.Parallel()
	e := setup(t, false)
	var mine []*sse
	for range jobsapi.MaxNSStreams {
		mine = append(mine, openEvents(t, e, "tok-a", "", ""))
	}
	code, body := e.call(t, "tok-a", http.MethodGet, "/api/events", nil)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), "too_many_streams") || !strings.Contains(string(body), "close one") {
		t.Fatalf("stream %d of namespace a: %d %s", jobsapi.MaxNSStreams+1, code, body)
	}
	openEvents(t, e, "tok-b", "", "") // fails the test unless it opens
	mine[0].close()
	// The slot comes back when the handler has returned.
	for i := 0; ; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/api/events", nil)
		req.Header.Set("Authorization", "Bearer tok-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		ok := resp.StatusCode == http.StatusOK
		_ = resp.Body.Close()
		cancel()
		if ok {
			break
		}
		if i == 100 {
			t.Fatalf("namespace a never got its closed stream's slot back: %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
