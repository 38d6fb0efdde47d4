// Package httperr is the one shape of mcpexec's HTTP answers that fail, for
// the jobs API, the console and the MCP endpoint alike:
//
//	{"error": {"code": "not_found", "message": "what was wrong and what to do"}}
//
// and the one mapping of errors to those answers, by the error's kind
// (errs.Kind).
package httperr

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Body is the "error" member of a failed answer.
type Body struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteJSON answers v as JSON with status; answers are never cached.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to tell it
}

// Write answers a failure: status, and {"error": {code, message}}.
func Write(w http.ResponseWriter, status int, code, msg string) {
	WriteJSON(w, status, struct {
		Error Body `json:"error"`
	}{Body{Code: code, Message: msg}})
}

// WriteErr answers err as Classify maps it.
func WriteErr(w http.ResponseWriter, err error) {
	status, code, msg := Classify(err)
	Write(w, status, code, msg)
}

// Classify maps err to an HTTP status, the answer's code (the kind's wire
// name; "invalid_job" for a job that fails its checks) and its message.
func Classify(err error) (status int, code, msg string) {
	k := errs.KindOf(err)
	switch k {
	case errs.Invalid:
		var inv *jobs.InvalidError
		if errors.As(err, &inv) {
			return http.StatusBadRequest, "invalid_job", err.Error()
		}
		return http.StatusBadRequest, k.String(), err.Error()
	case errs.Quota:
		return http.StatusBadRequest, k.String(), err.Error()
	case errs.NotFound:
		return http.StatusNotFound, k.String(), err.Error()
	case errs.Conflict:
		return http.StatusConflict, k.String(), err.Error()
	case errs.OverCap:
		return http.StatusTooManyRequests, k.String(), err.Error()
	case errs.QueueFull:
		return http.StatusServiceUnavailable, k.String(), "the job queue is full, so the job was rejected: retry later with a new id, or add workers"
	case errs.ShuttingDown, errs.Unavailable:
		return http.StatusServiceUnavailable, k.String(), err.Error()
	}
	return http.StatusInternalServerError, errs.Internal.String(), err.Error()
}
