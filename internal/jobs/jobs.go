package jobs

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/oklog/ulid/v2"
)

// Status is where a job is in its life.
type Status string

// Job statuses. Every accepted job ends in exactly one terminal status.
const (
	// StatusWaiting: the job names parents (Job.After, Job.AfterAny) that
	// have not all ended yet; it is queued when they have.
	StatusWaiting    Status = "waiting"
	StatusQueued     Status = "queued"
	StatusRunning    Status = "running"
	StatusSuccess    Status = "success"
	StatusError      Status = "error"
	StatusTimeout    Status = "timeout"
	StatusCancelled  Status = "cancelled"
	StatusWorkerLost Status = "worker_lost"
	StatusRejected   Status = "rejected"
	// StatusInfraError: no worker could run the job's code (no container could
	// be created or started) on any of its deliveries.
	StatusInfraError Status = "infra_error"
	// StatusSkipped: a parent the job needed to succeed (Job.After) did not;
	// the job never ran.
	StatusSkipped Status = "skipped"
)

// Terminal reports whether s is a final status.
func (s Status) Terminal() bool {
	switch s {
	case StatusSuccess, StatusError, StatusTimeout, StatusCancelled, StatusWorkerLost, StatusRejected, StatusInfraError, StatusSkipped:
		return true
	}
	return false
}

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	return s == StatusWaiting || s == StatusQueued || s == StatusRunning || s.Terminal()
}

// Job is one unit of work: code to run in a sandbox, and where it may reach.
type Job struct {
	ID          string            `json:"id"`
	Code        string            `json:"code"`
	Servers     []string          `json:"servers,omitempty"`
	Timeout     int               `json:"timeout"` // seconds
	Session     string            `json:"session,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Frontend    string            `json:"frontend,omitempty"`
	Pool        string            `json:"pool,omitempty"`
	MaxAttempts int               `json:"max_attempts"`
	SubmittedAt time.Time         `json:"submitted_at"`
	Labels      map[string]string `json:"labels,omitempty"`
	// RetryOf names the dead-letter job this one re-runs, if any.
	RetryOf string `json:"retry_of,omitempty"`
	// After names jobs that must all succeed before this one runs; if one
	// ends otherwise, this one ends skipped. AfterAny names jobs that must
	// end, in any status, before it runs. Until then it is waiting.
	After    []string `json:"after,omitempty"`
	AfterAny []string `json:"after_any,omitempty"`
	// MemoryMB and CPUs size the job's sandbox; zero is the worker's default
	// (512 MiB, one CPU). A job that asks for its own size gets a container
	// of its own, not a warm one.
	MemoryMB int     `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	// Language is what the code is written in: LangPython (the default,
	// also when empty) or LangJavaScript. Only workers that can run it take
	// the job.
	Language string `json:"language,omitempty"`
	// TraceParent is the W3C traceparent of the front-end's span that
	// submitted the job: the worker's spans are its children, so every span
	// of the job is in its trace. The front-end sets it (from the caller's
	// traceparent when one came, else a trace id derived from the job id);
	// a caller's own value is never taken. See ValidTraceParent.
	TraceParent string `json:"traceparent,omitempty"`
	// Files are the job's input files, placed under /workspace before its
	// code starts; their bytes are in the file store (see FileInput).
	Files []FileInfo `json:"input_files,omitempty"`
	// Inputs are the input files as the caller gave them: the front-end
	// stores them and lists them in Files; they never travel.
	Inputs []FileInput `json:"-"`
	// FileLimits bound its files in and out (nil: DefaultFileLimits).
	FileLimits *FileLimits `json:"file_limits,omitempty"`
	// SubmittedBy is who submitted the job as the front-end authenticated
	// them (WithSubmitter: a token's fingerprint, an OAuth subject; empty
	// without auth), for the audit trail. The front-end sets it; a
	// caller's own value is never taken.
	SubmittedBy string `json:"submitted_by,omitempty"`
}

// FilesLimits returns the job's file limits, defaults filled in.
func (j *Job) FilesLimits() FileLimits {
	if j.FileLimits == nil {
		return DefaultFileLimits()
	}
	return j.FileLimits.Or()
}

// Languages the sandbox runs.
const (
	LangPython     = "python"
	LangJavaScript = "javascript"
)

// Languages lists the languages a job may be written in.
var Languages = []string{LangPython, LangJavaScript}

// Lang returns the job's language (LangPython when it names none).
func (j *Job) Lang() string {
	if j.Language == "" {
		return LangPython
	}
	return j.Language
}

// Parents returns the ids the job waits for: After, then AfterAny.
func (j *Job) Parents() []string {
	return append(append([]string(nil), j.After...), j.AfterAny...)
}

// Waits reports whether the job names parents.
func (j *Job) Waits() bool { return len(j.After)+len(j.AfterAny) > 0 }

// TimeoutDuration returns the job's time limit.
func (j *Job) TimeoutDuration() time.Duration { return time.Duration(j.Timeout) * time.Second }

// Result is the outcome of a job.
type Result struct {
	Status          Status `json:"status"`
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	Error           string `json:"error,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	Worker          string `json:"worker,omitempty"`
	Attempt         int    `json:"attempt,omitempty"`
	// SandboxFailed says the sandbox itself failed (not the user's code): the job
	// is kept as a dead letter.
	SandboxFailed bool `json:"sandbox_failed,omitempty"`
	// Files are what the code wrote under /workspace/out (and the figures
	// it drew), kept in the file store.
	Files []FileInfo `json:"files,omitempty"`
	// Notes say what of the code's files was not kept, and why.
	Notes []string `json:"notes,omitempty"`
}

var (
	entropyMu sync.Mutex
	entropy   = ulid.Monotonic(rand.Reader, 0)
)

// NewID returns a new sortable job id (a ULID).
func NewID() string {
	entropyMu.Lock()
	defer entropyMu.Unlock()
	return ulid.MustNew(ulid.Timestamp(time.Now()), entropy).String()
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,160}$`)

// MaxIDLength is the longest job id a caller may choose; the wire id adds the
// namespace's tag (see ScopedID).
const MaxIDLength = 128

// ValidID reports whether id may be used as a wire id (a job's id on NATS and
// in records, worker and front-end ids, sessions): 1–160 letters, digits, '-'
// or '_' (it becomes a subject token and a Nats-Msg-Id).
func ValidID(id string) bool { return idPattern.MatchString(id) }

// ValidUserID reports whether id may be chosen by a caller as a job id: 1–128
// letters, digits, '-' or '_'.
func ValidUserID(id string) bool { return len(id) <= MaxIDLength && idPattern.MatchString(id) }

// Limits bound what a submission may ask for.
type Limits struct {
	MaxCodeBytes   int // largest accepted code
	DefaultTimeout int // seconds, when the job gives none
	MaxTimeout     int // seconds
	MaxAttempts    int // upper bound of max_attempts
	MaxServers     int
	MaxLabels      int
	MaxParents     int     // ids in After and AfterAny together
	MaxMemoryMB    int     // largest MemoryMB a job may ask for
	MaxCPUs        float64 // largest CPUs a job may ask for
}

// DefaultLimits are the limits of DESIGN.md §7: code up to 256 KiB, timeout 30 s
// by default and 120 s at most, at most 4 attempts.
func DefaultLimits() Limits {
	return Limits{
		MaxCodeBytes:   256 << 10,
		DefaultTimeout: 30,
		MaxTimeout:     120,
		MaxAttempts:    4,
		MaxServers:     64,
		MaxLabels:      32,
		MaxParents:     1000,
		MaxMemoryMB:    512,
		MaxCPUs:        1,
	}
}

// InvalidError says what was wrong with a submission and what to do.
type InvalidError struct {
	Field   string
	Message string
}

func (e *InvalidError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Message) }

// ErrKind makes an InvalidError of kind errs.Invalid.
func (e *InvalidError) ErrKind() errs.Kind { return errs.Invalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Normalize fills defaults (id, timeout, attempts, submission time) and validates
// j against l. The error is an *InvalidError naming the field.
func (j *Job) Normalize(l Limits, now time.Time) error {
	if j.ID == "" {
		j.ID = NewID()
	} else if !ValidUserID(j.ID) {
		return invalid("id", "%q must be 1-128 characters of letters, digits, '-' or '_'", errs.Clip(j.ID, 40))
	}
	if j.Code == "" {
		return invalid("code", "code is required: pass the Python source to run")
	}
	if len(j.Code) > l.MaxCodeBytes {
		return invalid("code", "code is %d bytes, over the limit of %d bytes: send less code, or load data through a tool instead of inlining it", len(j.Code), l.MaxCodeBytes)
	}
	if j.Timeout == 0 {
		j.Timeout = l.DefaultTimeout
	}
	if j.Timeout < 1 || j.Timeout > l.MaxTimeout {
		return invalid("timeout", "%d seconds is outside 1..%d", j.Timeout, l.MaxTimeout)
	}
	if j.MaxAttempts == 0 {
		j.MaxAttempts = 1
	}
	if j.MaxAttempts < 1 || j.MaxAttempts > l.MaxAttempts {
		return invalid("max_attempts", "%d is outside 1..%d", j.MaxAttempts, l.MaxAttempts)
	}
	if len(j.Servers) > l.MaxServers {
		return invalid("servers", "%d servers named, at most %d allowed", len(j.Servers), l.MaxServers)
	}
	if len(j.Labels) > l.MaxLabels {
		return invalid("labels", "%d labels, at most %d allowed", len(j.Labels), l.MaxLabels)
	}
	for k, v := range j.Labels {
		if k == "" || len(k) > 128 || len(v) > 512 || strings.ContainsAny(k, "=,") {
			return invalid("labels", "label %q: keys must be 1-128 bytes without '=' or ',', values at most 512 bytes", errs.Clip(k, 40))
		}
	}
	if j.MemoryMB < 0 || j.MemoryMB > l.MaxMemoryMB || (j.MemoryMB > 0 && j.MemoryMB < 16) {
		return invalid("memory_mb", "%d MiB is outside 16..%d: ask for less, or for a namespace whose policy allows more (max_memory_mb)", j.MemoryMB, l.MaxMemoryMB)
	}
	if j.CPUs < 0 || j.CPUs > l.MaxCPUs || (j.CPUs > 0 && j.CPUs < 0.1) {
		return invalid("cpus", "%g CPUs is outside 0.1..%g: ask for less, or for a namespace whose policy allows more (max_cpus)", j.CPUs, l.MaxCPUs)
	}
	if err := j.checkParents(l); err != nil {
		return err
	}
	if j.RetryOf != "" && !ValidID(j.RetryOf) {
		return invalid("retry_of", "%q is not a job id", errs.Clip(j.RetryOf, 40))
	}
	if j.Session != "" && !ValidID(j.Session) {
		return invalid("session", "%q must be 1-128 characters of letters, digits, '-' or '_'", errs.Clip(j.Session, 40))
	}
	if j.Language == LangPython {
		j.Language = "" // the default: its records and messages stay as they were
	} else if j.Language != "" && !slices.Contains(Languages, j.Language) {
		return invalid("language", "%q is not a language the sandbox runs: use one of %s", errs.Clip(j.Language, 40), strings.Join(Languages, ", "))
	}
	if j.TraceParent != "" && !ValidTraceParent(j.TraceParent) {
		return invalid("traceparent", "%q is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lower case)", errs.Clip(j.TraceParent, 60))
	}
	if err := j.CheckFiles(); err != nil {
		return err
	}
	if j.Pool == "" {
		j.Pool = DefaultPool
	} else if !ValidID(j.Pool) {
		return invalid("pool", "%q must be letters, digits, '-' or '_'", errs.Clip(j.Pool, 40))
	}
	if j.SubmittedAt.IsZero() {
		j.SubmittedAt = now.UTC()
	}
	return nil
}

func (j *Job) checkParents(l Limits) error {
	max := l.MaxParents
	if max == 0 {
		max = DefaultLimits().MaxParents
	}
	if n := len(j.After) + len(j.AfterAny); n > max {
		return invalid("after", "%d parents named, at most %d allowed: join through an intermediate job", n, max)
	}
	seen := map[string]bool{}
	for _, p := range j.Parents() {
		field := "after"
		if !slices.Contains(j.After, p) {
			field = "after_any"
		}
		switch {
		case !ValidUserID(p):
			return invalid(field, "%q is not a job id", errs.Clip(p, 40))
		case p == j.ID:
			return invalid(field, "job %s names itself as its parent", j.ID)
		case seen[p]:
			return invalid(field, "parent %s is named twice", p)
		}
		seen[p] = true
	}
	return nil
}

// CheckFiles checks the job's input files against its file limits.
func (j *Job) CheckFiles() error {
	l := j.FilesLimits()
	if len(j.Files) > l.MaxFiles {
		return invalid("files", "%d files given, at most %d allowed", len(j.Files), l.MaxFiles)
	}
	seen := map[string]bool{}
	var total int64
	for i, f := range j.Files {
		if err := CheckFileName(f.Name); err != nil {
			return invalid(fmt.Sprintf("files[%d].name", i), "%v", err)
		}
		if seen[f.Name] {
			return invalid(fmt.Sprintf("files[%d].name", i), "%q is given twice", f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.Size > l.MaxFileBytes {
			return invalid(fmt.Sprintf("files[%d]", i), "the file is %d bytes, over the limit of %d bytes", f.Size, l.MaxFileBytes)
		}
		if total += f.Size; total > l.MaxJobBytes {
			return invalid("files", "the files are over %d bytes together", l.MaxJobBytes)
		}
	}
	return nil
}

// DefaultPool is the worker pool jobs go to unless they name another.
const DefaultPool = "default"

// WorkerStatus is what a worker answers on jobs.Subjects.WorkerStatus.
type WorkerStatus struct {
	ID            string    `json:"id"`
	Pool          string    `json:"pool"`
	Languages     []string  `json:"languages,omitempty"` // what its sandboxes run
	Healthy       bool      `json:"healthy"`
	Reason        string    `json:"reason,omitempty"` // why it takes no jobs
	Since         time.Time `json:"since"`            // of its current health
	Slots         int       `json:"slots"`
	Running       int       `json:"running"`
	Warm          int       `json:"warm"`
	Started       uint64    `json:"sandboxes_started"`
	StartFailures uint64    `json:"sandbox_start_failures"`
	Runtime       string    `json:"runtime,omitempty"` // its sandbox runtime: podman, docker, process
	Sessions      int       `json:"sessions"`          // sessions it holds
	Load1         float64   `json:"load1,omitempty"`   // the host's load average over a minute (Linux)
	At            time.Time `json:"at,omitempty"`      // when it answered
}

// ServerState is a proxied MCP server and whether its process (or remote
// session) is open: servers start on their first call.
type ServerState struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
}

// FrontendStatus is what a front-end answers on Subjects.FrontendStatus.
type FrontendStatus struct {
	ID             string        `json:"id"`
	Broker         string        `json:"broker,omitempty"` // the broker it is connected to
	Servers        []ServerState `json:"servers"`
	CallsPerMinute float64       `json:"calls_per_minute"` // proxy calls it answered, over the last minute
	Running        int           `json:"running"`          // run_python calls in flight on it
	At             time.Time     `json:"at"`               // when it answered
}
