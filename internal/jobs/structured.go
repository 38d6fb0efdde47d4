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
	}
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
