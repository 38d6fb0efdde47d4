package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Status is the outcome class of one run, as seen by the sandbox.
type Status string

// Outcomes of a run.
const (
	StatusSuccess Status = "success"
	StatusError   Status = "error"
	StatusTimeout Status = "timeout"
)

// Limits bound what one sandbox may use.
type Limits struct {
	Memory    int64   // bytes of memory (and swap); 0 means no limit
	Pids      int64   // processes and threads; 0 means no limit
	CPUs      float64 // CPUs; 0 means no limit
	TmpfsSize int64   // bytes of each tmpfs (/tmp, /workspace)
	User      string  // "uid:gid" the code runs as
	NoFile    uint64  // RLIMIT_NOFILE
	NProc     uint64  // RLIMIT_NPROC
}

// DefaultLimits returns the limits of DESIGN.md §7, and one CPU.
func DefaultLimits() Limits {
	return Limits{
		Memory:    512 << 20,
		Pids:      128,
		CPUs:      1,
		TmpfsSize: 64 << 20,
		User:      "65534:65534",
		NoFile:    1024,
		NProc:     1024,
	}
}

// DefaultOutputCap is the default number of bytes kept of each of stdout and stderr.
const DefaultOutputCap = 1 << 20

// Job is what a Runtime runs.
type Job struct {
	ID   string
	Code string
	// Language is what Code is written in: Python ("" too) or JavaScript.
	Language  string
	Servers   []string      // server names the code may call through the host
	Timeout   time.Duration // wall-clock limit of the run
	OutputCap int           // bytes kept of each stream; 0 means DefaultOutputCap
	// Memory (bytes) and CPUs size the job's sandbox; zero is the runtime's
	// configured limit. Runtimes that cannot size a sandbox per job ignore them.
	Memory int64
	CPUs   float64
	// Tenant is the namespace the job belongs to: a runtime that reuses
	// sandboxes gives one only to jobs of the tenant it served.
	Tenant string
	// Fresh is set by runtimes for a job that runs in a process of its own
	// (every job but a session's); see proxy.Frame.Fresh.
	Fresh bool
	// BeforeExec, when set, is called by runtimes that implement StartReporter
	// once the job's sandbox is up: the job has reached the code (failures
	// before it are the host's, not the code's). It is called just before
	// the code is sent, or, for a fresh job, while the code is sent and
	// runs, with nothing of the code's (output, calls, files, its end)
	// taken from the sandbox until it has returned (RunnerConn.Exec). An
	// error from it aborts the run: Run returns it wrapped in ErrNotStarted,
	// and nothing of the code's has left the sandbox, which is discarded.
	BeforeExec func() error
	// Files are placed under the workspace (/workspace) before the code
	// starts; FileLimits bound the files the job writes under
	// /workspace/out, which come back in Result.Files.
	Files      []File
	FileLimits FileLimits
	// OnSandbox, when set, is told the short id of the container the job
	// runs in, before BeforeExec (runtimes with containers; the worker puts
	// it on the job's spans).
	OnSandbox func(id string)

	// start is a fresh job's BeforeExec running beside its code (Exec).
	start *startRun
}

// File is one file of a job: an input placed under /workspace, or one it
// wrote under /workspace/out (Name is then relative to out).
type File struct {
	Name string
	Data []byte
}

// FileLimits bound the files a job sends back. Zero fields take
// DefaultFileLimits'; no field may exceed HardFileLimits'.
type FileLimits struct {
	MaxFiles     int
	MaxFileBytes int64
	MaxJobBytes  int64
}

// DefaultFileLimits are 100 files of up to 8 MiB, 32 MiB together.
func DefaultFileLimits() FileLimits {
	return FileLimits{MaxFiles: 100, MaxFileBytes: 8 << 20, MaxJobBytes: 32 << 20}
}

// HardFileLimits hold whatever a job asks: a file travels in one frame
// (base64, within proxy.DefaultMaxFrame).
func HardFileLimits() FileLimits {
	return FileLimits{MaxFiles: 1000, MaxFileBytes: 10 << 20, MaxJobBytes: 256 << 20}
}

// Or fills l's zero fields from DefaultFileLimits and holds it to HardFileLimits.
func (l FileLimits) Or() FileLimits {
	d, h := DefaultFileLimits(), HardFileLimits()
	if l.MaxFiles <= 0 {
		l.MaxFiles = d.MaxFiles
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxJobBytes <= 0 {
		l.MaxJobBytes = d.MaxJobBytes
	}
	l.MaxFiles, l.MaxFileBytes, l.MaxJobBytes = min(l.MaxFiles, h.MaxFiles), min(l.MaxFileBytes, h.MaxFileBytes), min(l.MaxJobBytes, h.MaxJobBytes)
	return l
}

// ErrNotStarted wraps the error of a BeforeExec hook that aborted a run.
var ErrNotStarted = errors.New("the job was not started")

// StartReporter is implemented by runtimes that call Job.BeforeExec.
type StartReporter interface {
	ReportsStart()
}

// BeforeExec calls job's hook, if any, as runtimes do just before they send
// the code.
func BeforeExec(job Job) error {
	if job.BeforeExec == nil {
		return nil
	}
	if err := job.BeforeExec(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotStarted, err)
	}
	return nil
}

// Languages a job's code may be written in (jobs.LangPython, jobs.LangJavaScript).
const (
	Python     = "python"
	JavaScript = "javascript"
)

// LanguageReporter is implemented by runtimes whose sandboxes may run more
// than Python; Languages lists what they run.
type LanguageReporter interface {
	Languages() []string
}

// Languages returns the languages rt runs: its report, or Python alone.
func Languages(rt Runtime) []string {
	if lr, ok := rt.(LanguageReporter); ok {
		if l := lr.Languages(); len(l) > 0 {
			return l
		}
	}
	return []string{Python}
}

// Prober is implemented by runtimes that can check, without a job, that they
// can start sandboxes (a sick worker probes before it takes jobs again).
type Prober interface {
	Probe(ctx context.Context) error
}

// Host answers the sandbox's proxy calls and receives its live output.
// Call returns the JSON result, or an error whose text reaches the code as MCPError.
type Host interface {
	Call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
	Output(stream, data string)
}

// Result is the outcome of one run. A failure of the user's code is a Result, not
// an error.
type Result struct {
	Status          Status
	ExitCode        int
	Stdout          string
	Stderr          string
	StdoutTruncated bool
	StderrTruncated bool
	Error           string
	Duration        time.Duration
	// Files are what the job wrote under /workspace/out (and its figures),
	// checked against its FileLimits; Notes say what was not kept, and why.
	Files []File
	Notes []string
}

// Runtime runs jobs in sandboxes. Run returns an error only when the sandbox itself
// failed (could not start, lost its runner for a reason other than the code); the
// caller may retry such a job elsewhere.
type Runtime interface {
	Run(ctx context.Context, job Job, host Host) (Result, error)
	Close() error
}

// SessionRuntime is a Runtime that can keep a sandbox, and the Python globals in
// it, across the jobs of one session.
//
// RunInSession runs job in session's sandbox, starting one (from the warm pool
// where there is one) when the session has none. The sandbox outlives the job; the
// jobs of one session run one at a time, in the order they acquire it. A run that
// leaves the sandbox unusable (timeout, cancellation, crash, memory limit, protocol
// error) ends the session with it: HasSession then reports false and the next
// RunInSession starts afresh. EndSession removes the session's sandbox (after its
// running job, if any); ending an unknown session is not an error. Close ends every
// session.
type SessionRuntime interface {
	Runtime
	RunInSession(ctx context.Context, session string, job Job, host Host) (Result, error)
	HasSession(session string) bool
	EndSession(session string) error
}

// ErrRunnerLost is returned by Drive when the runner's connection ends before it
// reported the job done: the sandbox died (OOM kill, killed process, crash).
var ErrRunnerLost = errors.New("sandbox runner exited before the job finished")

// NopHost answers every call with an error and drops output.
type NopHost struct{}

// Call implements Host.
func (NopHost) Call(context.Context, string, json.RawMessage) (json.RawMessage, error) {
	return nil, errors.New("no proxy host is attached to this sandbox")
}

// Output implements Host.
func (NopHost) Output(string, string) {}

// Stats are a runtime's counters, exported as metrics.
type Stats struct {
	Started       uint64 // sandboxes started
	StartFailures uint64 // sandboxes that failed to start
	Warm          int    // started sandboxes waiting for a job
	// Direct counts the jobs whose exec went straight to the process
	// waiting for it (past the runner's supervisor; RunnerConn.DirectExecs).
	Direct uint64
}

// StatsReporter is implemented by runtimes that count their sandboxes.
type StatsReporter interface {
	Stats() Stats
}
