package jobsapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// WorkflowLabel is the label that ties a workflow's jobs together: its id.
const WorkflowLabel = "workflow"

// WorkflowRequest is the body of POST /api/workflows.
type WorkflowRequest struct {
	ID     string            `json:"id,omitempty"` // default: a new ULID
	Labels map[string]string `json:"labels,omitempty"`
	Jobs   []JobRequest      `json:"jobs"`
}

// Workflow is the answer of both workflow routes: the workflow's status
// (running while any job has not ended, success when all succeeded, failed
// otherwise), its jobs' counts by status, and its jobs.
type Workflow struct {
	ID     string         `json:"id"`
	Status string         `json:"status"`
	Counts map[string]int `json:"counts"`
	Jobs   []Item         `json:"jobs"`
}

func (a *api) submitWorkflow(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes: split the work, and join the parts with after on ids submitted before", tooLarge.Limit), nil)
		return
	}
	var req WorkflowRequest
	if err == nil {
		err = decodeStrict(body, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", `the body must be {"id": "...", "labels": {...}, "jobs": [{"id", "code", "after": [...], "after_any": [...], ...}]}: `+err.Error(), nil)
		return
	}
	if len(req.Jobs) == 0 || len(req.Jobs) > MaxBatch {
		writeError(w, http.StatusBadRequest, "bad_batch", fmt.Sprintf("a workflow has 1 to %d jobs, got %d", MaxBatch, len(req.Jobs)), nil)
		return
	}
	if req.ID == "" {
		req.ID = jobs.NewID()
	} else if !jobs.ValidUserID(req.ID) || len(req.ID) > 512 {
		writeError(w, http.StatusBadRequest, "bad_id", fmt.Sprintf("workflow id %.40q must be 1-128 letters, digits, '-' or '_'", req.ID), nil)
		return
	}
	if _, ok := req.Labels[WorkflowLabel]; ok {
		writeError(w, http.StatusBadRequest, "bad_label", "the label "+WorkflowLabel+" is the workflow's id: set id instead", nil)
		return
	}
	js := make([]*jobs.Job, len(req.Jobs))
	for i, q := range req.Jobs {
		j := q.job()
		if v, ok := j.Labels[WorkflowLabel]; ok && v != req.ID {
			writeError(w, http.StatusBadRequest, "bad_label", fmt.Sprintf("job %d: the label %s is the workflow's id (%s)", i, WorkflowLabel, req.ID), nil)
			return
		}
		labels := map[string]string{}
		for k, v := range req.Labels {
			labels[k] = v
		}
		for k, v := range j.Labels {
			labels[k] = v
		}
		labels[WorkflowLabel] = req.ID
		j.Labels = labels
		js[i] = j
	}
	res := a.be.SubmitWorkflow(r.Context(), js, a.cfg.Namespace(r.Context()))
	out := Workflow{ID: req.ID, Jobs: make([]Item, len(res))}
	status, created := http.StatusOK, false
	var first error
	for i, s := range res {
		out.Jobs[i] = Item{Record: s.Record, Existing: s.Existing}
		if s.Err != nil {
			_, code, msg := httperr.Classify(s.Err)
			out.Jobs[i].Error = &ErrorBody{Code: code, Message: msg}
			if first == nil {
				first = s.Err
			}
		}
		created = created || (s.Err == nil && !s.Existing)
	}
	if first != nil && created {
		// Some were submitted (a refusal found late, e.g. a full queue): the
		// answer lists each job's fate.
		status = http.StatusMultiStatus
	} else if first != nil {
		st, code, msg := httperr.Classify(first)
		out = summarize(out)
		out.Status = "refused"
		httperr.WriteJSON(w, st, struct {
			Error ErrorBody `json:"error"`
			Workflow
		}{ErrorBody{Code: code, Message: "the workflow was not submitted: " + msg}, out})
		return
	} else if created {
		status = http.StatusCreated
	}
	httperr.WriteJSON(w, status, summarize(out))
}

// summarize fills the workflow's status and counts from its jobs.
func summarize(wf Workflow) Workflow {
	wf.Counts = map[string]int{}
	wf.Status = string(jobs.StatusSuccess)
	failed := false
	for _, it := range wf.Jobs {
		if it.Record == nil {
			continue
		}
		wf.Counts[string(it.Status)]++
		switch {
		case !it.Status.Terminal():
			wf.Status = "running"
		case it.Status != jobs.StatusSuccess:
			failed = true
		}
	}
	if failed && wf.Status != "running" {
		wf.Status = "failed"
	}
	return wf
}

func (a *api) getWorkflow(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !jobs.ValidUserID(id) {
		writeError(w, http.StatusBadRequest, "bad_id", fmt.Sprintf("%.40q is not a workflow id", id), nil)
		return
	}
	wf := Workflow{ID: id}
	f := jobs.Filter{Labels: map[string]string{WorkflowLabel: id}, Limit: jobs.MaxListLimit}
	for {
		recs, next, err := a.be.List(r.Context(), a.cfg.Namespace(r.Context()), f)
		if err != nil {
			status, code, msg := httperr.Classify(err)
			writeError(w, status, code, msg, nil)
			return
		}
		for _, rec := range recs {
			wf.Jobs = append(wf.Jobs, Item{Record: rec})
		}
		if next == "" || len(wf.Jobs) >= MaxBatch {
			break
		}
		f.Cursor = next
	}
	if len(wf.Jobs) == 0 {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no workflow %q in this namespace (or its jobs ended longer ago than the retention)", id), nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, summarize(wf))
}
