package jobs

import (
	"fmt"
	"strings"
)

// Structured is a finished job as run_python's structuredContent shows it,
// and as job_result hands a parent's outcome to the code of a child.
type Structured struct {
	Status         string   `json:"status"`
	Summary        string   `json:"summary"`
	ExitCode       int      `json:"exitCode"`
	Stdout         []string `json:"stdout"`
	Stderr         []string `json:"stderr"`
	Error          string   `json:"error,omitempty"`
	TimeoutSeconds int      `json:"timeoutSeconds"`
	JobID          string   `json:"jobId"`
	// Files are what the code wrote under /workspace/out (and its figures);
	// Notes say what of them was not kept.
	Files []StructuredFile `json:"files,omitempty"`
	Notes []string         `json:"notes,omitempty"`
}

// StructuredFile is one file of a job's result, with the URI it is read at.
type StructuredFile struct {
	Name     string `json:"name"`
	Size     int64  `json:"size"`
	MimeType string `json:"mimeType"`
	URI      string `json:"uri"`
}

// Structured returns the record's outcome (its status alone while it has no
// result).
func (r *Record) Structured() Structured {
	res := r.Result
	if res == nil {
		res = &Result{Status: r.Status}
	}
	return Structured{
		Status:         string(res.Status),
		Summary:        summary(res),
		ExitCode:       res.ExitCode,
		Stdout:         lines(res.Stdout),
		Stderr:         lines(res.Stderr),
		Error:          res.Error,
		TimeoutSeconds: r.Job.Timeout,
		JobID:          r.Job.ID,
		Files:          r.structuredFiles(),
		Notes:          res.Notes,
	}
}

func (r *Record) structuredFiles() []StructuredFile {
	if r.Result == nil || len(r.Result.Files) == 0 {
		return nil
	}
	out := make([]StructuredFile, len(r.Result.Files))
	for i, f := range r.Result.Files {
		out[i] = StructuredFile{Name: f.Name, Size: f.Size, MimeType: f.MimeType, URI: FileURI(r.Job.ID, f.Name)}
	}
	return out
}

func summary(r *Result) string {
	switch r.Status {
	case StatusSuccess:
		if r.Stdout == "" && r.Stderr == "" {
			return "Success (no output)"
		}
		return "Success"
	case StatusTimeout:
		return "Timed out"
	default:
		if r.Error != "" {
			return fmt.Sprintf("%s: %s", r.Status, r.Error)
		}
		return string(r.Status)
	}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return []string{}
	}
	return strings.Split(s, "\n")
}
