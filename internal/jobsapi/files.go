package jobsapi

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// file serves GET /api/jobs/{id}/files/{name...}: the bytes of a file the
// caller's job wrote. Another namespace's job is "no such job". Pictures
// are served inline (the console shows them); everything else as an
// attachment, and nothing may run scripts in the API's origin.
func (a *api) file(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("id"), r.PathValue("name")
	if !jobs.ValidUserID(id) {
		writeError(w, http.StatusBadRequest, "bad_id", fmt.Sprintf("%q is not a job id: ids are 1-128 letters, digits, '-' or '_'", id), nil)
		return
	}
	if err := jobs.CheckFileName(name); err != nil {
		writeError(w, http.StatusBadRequest, "bad_name", err.Error(), nil)
		return
	}
	info, data, err := a.be.File(r.Context(), a.cfg.Namespace(r.Context()), id, name)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		if errs.KindOf(err) == errs.NotFound {
			msg = fmt.Sprintf("no such job or file: job %q, file %q", id, name)
		}
		writeError(w, status, code, msg, nil)
		return
	}
	h := w.Header()
	h.Set("Content-Type", info.MimeType)
	h.Set("Content-Length", strconv.Itoa(len(data)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Cache-Control", "private, max-age=3600")
	if !jobs.IsImage(info.MimeType) {
		h.Set("Content-Disposition", "attachment; filename*=UTF-8''"+urlPathEscape(lastPart(name)))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data) // the client may be gone
}

func lastPart(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			return name[i+1:]
		}
	}
	return name
}

func urlPathEscape(s string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}
