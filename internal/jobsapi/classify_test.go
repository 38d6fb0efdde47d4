package jobsapi

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// TestClassify: the front-end's, queue's and state's errors answer with the
// status and code the API documents.
func TestClassify(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("namespace a: %w", frontend.ErrOverCap), http.StatusTooManyRequests, "over_cap"},
		{fmt.Errorf("stop: %w", frontend.ErrShuttingDown), http.StatusServiceUnavailable, "shutting_down"},
		{queue.ErrQueueFull, http.StatusServiceUnavailable, "queue_full"},
		{fmt.Errorf("x: %w", state.ErrNotFound), http.StatusNotFound, "not_found"},
		{fmt.Errorf("x: %w", frontend.ErrUnavailable), http.StatusServiceUnavailable, "unavailable"},
		{fmt.Errorf("boom"), http.StatusInternalServerError, "internal"},
	}
	for _, tc := range cases {
		status, code, msg := httperr.Classify(tc.err)
		if status != tc.status || code != tc.code || msg == "" {
			t.Errorf("httperr.Classify(%v) = %d %s %q, want %d %s", tc.err, status, code, msg, tc.status, tc.code)
		}
	}
}
