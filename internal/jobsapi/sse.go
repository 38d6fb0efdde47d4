package jobsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// serveSSE streams Server-Sent Events to w until ctx ends, the client goes
// away or follow returns: follow runs in a goroutine of its own and hands
// each event to emit (which blocks while 64 are waiting to be written);
// frame writes one event's fields before its data (the "event:" line, and
// "id:" for a resumable stream). greeting is the stream's first comment. A
// comment every eventKeepalive keeps proxies from closing an idle stream,
// and an error of follow ends it with an "error" event. The follower is
// ended and waited for on every way out.
func serveSSE[T any](ctx context.Context, w http.ResponseWriter, greeting string, follow func(ctx context.Context, emit func(T) error) error, frame func(T) string) {
	ctx, cancel := context.WithCancel(ctx)
	evs := make(chan T, 64)
	errc := make(chan error, 1)
	followed := make(chan struct{})
	defer func() { cancel(); <-followed }()
	go func() {
		defer close(followed)
		errc <- follow(ctx, func(ev T) error {
			select {
			case evs <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(text string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(eventWriteWithin)) // a connection that refuses deadlines fails its next read or write
		if _, err := fmt.Fprint(w, text); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write(": " + greeting + "\n\n") {
		return
	}
	keep := time.NewTicker(eventKeepalive)
	defer keep.Stop()
	for {
		select {
		case ev := <-evs:
			data, _ := json.Marshal(ev)
			if !write(fmt.Sprintf("%sdata: %s\n\n", frame(ev), data)) {
				return
			}
		case <-keep.C:
			if !write(": keepalive\n\n") {
				return
			}
		case err := <-errc:
			if err != nil && !errors.Is(err, context.Canceled) {
				// The stream breaks; a client of a resumable stream
				// reconnects with Last-Event-ID.
				write(fmt.Sprintf("event: error\ndata: %s\n\n", strings.ReplaceAll(err.Error(), "\n", " ")))
			}
			return
		}
	}
}
