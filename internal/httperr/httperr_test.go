package httperr_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

func TestWriteShape(t *testing.T) {
	rec := httptest.NewRecorder()
	httperr.WriteErr(rec, fmt.Errorf("look up: %w", errs.New(errs.NotFound, "no such job")))
	var body struct {
		Error httperr.Body `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusNotFound || body.Error.Code != "not_found" || body.Error.Message != "look up: no such job" ||
		rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v %+v", rec.Code, rec.Header(), body)
	}
}

func TestClassifyKinds(t *testing.T) {
	inv := &jobs.Job{Code: ""}
	err := inv.Normalize(jobs.DefaultLimits(), time.Now())
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{err, http.StatusBadRequest, "invalid_job"},
		{errs.New(errs.Invalid, "bad"), http.StatusBadRequest, "invalid"},
		{errs.New(errs.Quota, "full"), http.StatusBadRequest, "quota"},
		{errs.New(errs.Conflict, "taken"), http.StatusConflict, "conflict"},
		{errs.New(errs.OverCap, "cap"), http.StatusTooManyRequests, "over_cap"},
		{errs.New(errs.QueueFull, "q"), http.StatusServiceUnavailable, "queue_full"},
		{fmt.Errorf("plain"), http.StatusInternalServerError, "internal"},
	} {
		if status, code, msg := httperr.Classify(tc.err); status != tc.status || code != tc.code || msg == "" {
			t.Errorf("Classify(%v) = %d %s %q, want %d %s", tc.err, status, code, msg, tc.status, tc.code)
		}
	}
}
