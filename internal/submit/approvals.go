package submit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
)

// statusLine is the terminal's status writer, shared by the progress line
// (rewritten in place with \r) and the approval notes (whole lines).
type statusLine struct {
	mu      sync.Mutex // guards w, partial
	w       io.Writer
	partial bool // the progress line is on screen, unended
}

// progress rewrites the progress line.
func (s *statusLine) progress(line string, end bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprint(s.w, "\r"+line)
	s.partial = !end
	if end {
		fmt.Fprint(s.w, "\n")
	}
}

// note prints whole lines below the progress line.
func (s *statusLine) note(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.partial {
		fmt.Fprint(s.w, "\n")
		s.partial = false
	}
	fmt.Fprint(s.w, text)
}

// approvalWatch tells, on the status writer, of the approvals asked and
// answered for the jobs of this run, from the front-end's approval events:
// why a job waits and how to answer it.
type approvalWatch struct {
	c   *Config
	out *statusLine

	mu   sync.Mutex // guards ours, told
	ours map[string]bool
	told map[string]bool // approvals whose asking was printed
}

func (c *Config) newApprovalWatch(out *statusLine) *approvalWatch {
	return &approvalWatch{c: c, out: out, ours: map[string]bool{}, told: map[string]bool{}}
}

// add makes job id one of this run's.
func (w *approvalWatch) add(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ours[id] = true
}

// maxShownArgs bounds the arguments a note prints.
const maxShownArgs = 300

// asked prints that a is waiting, once, with the commands that answer it.
func (w *approvalWatch) asked(a jobs.Approval) {
	w.mu.Lock()
	if !w.ours[a.JobID] || w.told[a.ID] || len(w.told) > 10000 {
		w.mu.Unlock()
		return
	}
	w.told[a.ID] = true
	w.mu.Unlock()
	args := string(a.Arguments)
	if len(args) > maxShownArgs {
		args = args[:maxShownArgs] + "…"
	}
	args = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' ' // no terminal control characters from a job's arguments
		}
		return r
	}, args)
	url := strings.TrimRight(w.c.URL, "/") + "/api/approvals/" + a.ID
	curl := func(body string) string {
		return fmt.Sprintf("curl -sS -H \"Authorization: Bearer $MCPEXEC_TOKEN\" -H 'Content-Type: application/json' -d '%s' %s", body, url)
	}
	w.out.note(fmt.Sprintf("job %s waits for approval %s: %s/%s %s (tool rule %q; denied unless answered by %s)\n  approve: %s\n  deny:    %s\n  (add \"scope\": \"job\" to also allow the job's later calls of %s/%s; the console's Approvals page shows the job's code)\n",
		a.JobID, a.ID, a.Server, a.Tool, args, a.Rule, a.ExpiresAt.Local().Format(time.TimeOnly),
		curl(`{"decision": "approve"}`), curl(`{"decision": "deny", "reason": "..."}`), a.Server, a.Tool))
}

// answered prints how an approval this run was told of ended.
func (w *approvalWatch) answered(ev jobs.ApprovalEvent) {
	w.mu.Lock()
	told := w.told[ev.ID]
	w.mu.Unlock()
	if !told {
		return
	}
	line := fmt.Sprintf("job %s: approval %s (%s/%s) %s", ev.JobID, ev.ID, ev.Server, ev.Tool, strings.ReplaceAll(ev.State, "_", " "))
	if ev.DecidedBy != "" {
		line += " by " + ev.DecidedBy
	}
	if ev.Scope != "" {
		line += ", for the " + ev.Scope
	}
	if ev.Reason != "" {
		line += ": " + ev.Reason
	}
	w.out.note(line + "\n")
}

// run follows the approval events until ctx ends, reconnecting after a
// break; a front-end without approvals is told of once, and not followed.
func (w *approvalWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := w.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		var unsupported errUnsupported
		if errors.As(err, &unsupported) {
			w.out.note("approvals are not shown: " + err.Error() + "\n")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

type errUnsupported struct{ error }

// follow opens the approval events, lists the approvals already waiting,
// and prints both until the stream ends.
func (w *approvalWatch) follow(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(w.c.URL, "/")+"/api/approvals/events", nil)
	if err != nil {
		return errUnsupported{err}
	}
	req.Header.Set("Accept", "text/event-stream")
	if w.c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+w.c.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // a stream: nothing to report
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNotImplemented || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return errUnsupported{fmt.Errorf("GET /api/approvals/events: %s", resp.Status)}
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("GET /api/approvals/events: %s", resp.Status)
	}
	// The stream is open: the calls parked before it are listed once.
	var list jobsapi.ApprovalsResponse
	if err := w.c.do(ctx, http.MethodGet, "/api/approvals", nil, &list); err == nil {
		for _, a := range list.Approvals {
			w.asked(a)
		}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev jobs.ApprovalEvent
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		switch ev.Kind {
		case jobs.ApprovalAsked:
			w.asked(ev.Approval)
		case jobs.ApprovalAnswered:
			w.answered(ev)
		}
	}
	return sc.Err()
}
