package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNeeds: what a broker still creating its streams answers is waited for,
// naming what is missing; anything else fails the start.
func TestNeeds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		what string // "": not waited for
	}{
		{"stream not found", fmt.Errorf("create consumer x: %w", jetstream.ErrStreamNotFound), "the jobs stream"},
		{"bucket not found", fmt.Errorf("open sessions bucket: %w", jetstream.ErrBucketNotFound), "the jobs stream"},
		{"no JetStream yet", jetstream.ErrJetStreamNotEnabled, "JetStream (the broker is starting, or its cluster electing leaders)"},
		{"no responders", nats.ErrNoResponders, "JetStream (the broker is starting, or its cluster electing leaders)"},
		{"attempt timed out", context.DeadlineExceeded, "JetStream (the broker is starting, or its cluster electing leaders)"},
		{"no leader", &jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, "JetStream (the broker is starting, or its cluster electing leaders)"},
		{"bad consumer config", &jetstream.APIError{Code: 400, Description: "consumer name already in use"}, ""},
		{"cancelled", context.Canceled, ""},
		{"other", errors.New("boom"), ""},
	} {
		err := needs("the jobs stream", tc.err)
		var nr *notReady
		switch {
		case tc.what == "" && errors.As(err, &nr):
			t.Errorf("%s: waited for %q", tc.name, nr.what)
		case tc.what != "" && !errors.As(err, &nr):
			t.Errorf("%s: not waited for: %v", tc.name, err)
		case tc.what != "" && nr.what != tc.what:
			t.Errorf("%s: waits for %q, want %q", tc.name, nr.what, tc.what)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.err)
		}
	}
	if needs("x", nil) != nil {
		t.Error("needs(nil) is not nil")
	}
}
