package jobsapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Bounds of GET /api/events.
const (
	MaxEventStreams  = 256              // open at once on one front-end
	MaxNSStreams     = 16               // of those, open at once for one namespace
	eventKeepalive   = 15 * time.Second // a comment line when nothing happens
	eventWriteWithin = 10 * time.Second // a client that does not read is dropped
)

// events serves GET /api/events: a Server-Sent Events stream of the
// namespace's job events, filtered by label (repeatable KEY=VALUE), prefix
// and workflow. Each event's id is its position in the fleet's events
// stream: a client that reconnects with Last-Event-ID (or ?after=) misses
// nothing.
func (a *api) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	match, err := eventFilter(q["label"], q.Get("prefix"), q.Get("workflow"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_filter", err.Error(), nil)
		return
	}
	after, resume := uint64(0), false
	for _, s := range []string{q.Get("after"), r.Header.Get("Last-Event-ID")} {
		if s == "" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_event_id", fmt.Sprintf("event id %.40q must be a whole number: the id of the last event received", s), nil)
			return
		}
		after, resume = n, true
	}
	ns := a.cfg.Namespace(r.Context())
	release, ok := a.streams.Take(ns)
	if !ok {
		w.Header().Set("Retry-After", "5")
		if mine, _ := a.streams.InUse(ns); mine >= MaxNSStreams {
			writeError(w, http.StatusTooManyRequests, "too_many_streams", fmt.Sprintf("namespace %q already has %d event streams open on this front-end: close one (one stream with filters can follow many jobs)", ns, mine), nil)
			return
		}
		writeError(w, http.StatusServiceUnavailable, "too_many_streams", fmt.Sprintf("this front-end already serves %d event streams: retry later, or use another front-end", MaxEventStreams), nil)
		return
	}
	defer release()
	serveSSE(r.Context(), w, "mcpexec job events", func(ctx context.Context, emit func(jobs.EventView) error) error {
		return a.be.Follow(ctx, ns, after, resume, func(ev jobs.EventView) error {
			if !match(ev) {
				return nil
			}
			return emit(ev)
		})
	}, func(ev jobs.EventView) string { return fmt.Sprintf("id: %d\nevent: %s\n", ev.Seq, ev.Kind) })
}

// eventFilter returns the matcher of the filters of GET /api/events.
func eventFilter(labels []string, prefix, workflow string) (func(jobs.EventView) bool, error) {
	want := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %.60q must be KEY=VALUE", l)
		}
		want[k] = v
	}
	if workflow != "" {
		if !jobs.ValidUserID(workflow) {
			return nil, fmt.Errorf("workflow %.40q is not a workflow id", workflow)
		}
		want[WorkflowLabel] = workflow
	}
	if len(prefix) > jobs.MaxIDLength {
		return nil, fmt.Errorf("prefix is over %d bytes", jobs.MaxIDLength)
	}
	return func(ev jobs.EventView) bool {
		if !strings.HasPrefix(ev.Job, prefix) {
			return false
		}
		for k, v := range want {
			if ev.Labels[k] != v {
				return false
			}
		}
		return true
	}, nil
}
