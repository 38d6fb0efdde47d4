package frontend

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/toolrules"
)

// Policy is what one namespace may do. Zero fields mean "no cap" (or, for
// Servers and MaxTimeout, "what the front-end allows everyone").
type Policy struct {
	// Servers are the MCP servers the namespace's jobs may be given and call;
	// empty allows every server the front-end proxies.
	Servers []string `json:"servers,omitempty"`
	// Pools are the worker pools its jobs may ask for (the default pool is
	// "default": list it to keep it); empty allows every pool.
	Pools []string `json:"pools,omitempty"`
	// MaxTimeout is the longest timeout, in seconds, its jobs may ask for;
	// it may exceed the front-end's default maximum (for batch namespaces).
	MaxTimeout int `json:"max_timeout,omitempty"`
	// MaxMemoryMB and MaxCPUs are the largest sandbox a job may ask for
	// (memory_mb, cpus); they may exceed the front-end's defaults (512 MiB,
	// one CPU) for batch namespaces.
	MaxMemoryMB int     `json:"max_memory_mb,omitempty"`
	MaxCPUs     float64 `json:"max_cpus,omitempty"`
	// MaxQueued caps its jobs waiting for a worker, MaxActive its jobs queued
	// or running, on each front-end.
	MaxQueued int `json:"max_queued,omitempty"`
	MaxActive int `json:"max_active,omitempty"`
	// MaxQueuedBytes caps the bytes of code of its jobs waiting for a
	// worker, on each front-end: the queue and the events stream are the
	// fleet's, and large code fills them faster than many jobs do.
	MaxQueuedBytes int64 `json:"max_queued_bytes,omitempty"`
	// MaxSessions caps its sessions (each holds a sandbox on a worker).
	MaxSessions int `json:"max_sessions,omitempty"`
	// MemoryBytes caps the bytes of its memory (keys, values and metadata).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// FilesBytes caps what its jobs' files (in and out) hold in the file
	// store; MaxFileBytes, MaxJobFilesBytes and MaxFiles bound one file, the
	// files of one job (in, or out) and their count.
	FilesBytes       int64 `json:"files_bytes,omitempty"`
	MaxFileBytes     int64 `json:"max_file_bytes,omitempty"`
	MaxJobFilesBytes int64 `json:"max_job_files_bytes,omitempty"`
	MaxFiles         int   `json:"max_files,omitempty"`
	// Redact is what the audit trail hides of its tool calls' arguments
	// (argument names and patterns, over audit.DefaultNames).
	Redact *audit.Redaction `json:"redact,omitempty"`
	// Tools are per-tool rules: "server/tool" globs to "allow", "deny" or
	// "ask", most specific first (package toolrules); ToolDefaults are the
	// verdicts, by the tool's MCP annotations, where no rule matches. With
	// neither set every call of an allowed server is allowed, as before.
	Tools        map[string]string   `json:"tools,omitempty"`
	ToolDefaults *toolrules.Defaults `json:"tool_defaults,omitempty"`
	// ApprovalTimeout is how long, in seconds, a call whose verdict is "ask"
	// waits for an answer before it is denied (default 600, at most 3600; the
	// job's own time limit bounds it too).
	ApprovalTimeout int `json:"approval_timeout,omitempty"`
	// MaxPendingApprovalsPerJob and MaxPendingApprovals cap the calls waiting
	// for an answer of one job (default 8) and of the namespace (default 64);
	// a call over either cap is denied at once.
	MaxPendingApprovalsPerJob int `json:"max_pending_approvals_per_job,omitempty"`
	MaxPendingApprovals       int `json:"max_pending_approvals,omitempty"`
}

// Approval defaults and bounds.
const (
	DefaultApprovalTimeout           = 600
	MaxApprovalTimeout               = 3600
	DefaultMaxPendingApprovalsPerJob = 8
	DefaultMaxPendingApprovals       = 64
)

// ToolRules compiles p's tool rules (nil when it has none: every call is
// allowed).
func (p Policy) ToolRules() (*toolrules.Rules, error) {
	return toolrules.Compile(p.Tools, p.ToolDefaults)
}

// FileLimits returns the bounds of a job's files under p.
func (p Policy) FileLimits() jobs.FileLimits {
	return jobs.FileLimits{MaxFileBytes: p.MaxFileBytes, MaxJobBytes: p.MaxJobFilesBytes, MaxFiles: p.MaxFiles, QuotaBytes: p.FilesBytes}.Or()
}

// DefaultPolicy is the policy of namespaces the configuration does not name:
// on by default, with room for batch work but not for one tenant to take the
// fleet.
func DefaultPolicy() Policy {
	return Policy{MaxQueued: 10_000, MaxActive: 10_000, MaxQueuedBytes: 256 << 20, MaxSessions: 16, MemoryBytes: 64 << 20, FilesBytes: 1 << 30}
}

// Inherit returns p with the fields it leaves zero taken from def: a named
// namespace's policy says only what differs from the default.
func (p Policy) Inherit(def Policy) Policy {
	if p.Servers == nil {
		p.Servers = def.Servers
	}
	if p.Pools == nil {
		p.Pools = def.Pools
	}
	if p.Redact == nil {
		p.Redact = def.Redact
	}
	p.MaxTimeout = cmp.Or(p.MaxTimeout, def.MaxTimeout)
	p.MaxMemoryMB = cmp.Or(p.MaxMemoryMB, def.MaxMemoryMB)
	p.MaxCPUs = cmp.Or(p.MaxCPUs, def.MaxCPUs)
	p.MaxQueued = cmp.Or(p.MaxQueued, def.MaxQueued)
	p.MaxActive = cmp.Or(p.MaxActive, def.MaxActive)
	p.MaxQueuedBytes = cmp.Or(p.MaxQueuedBytes, def.MaxQueuedBytes)
	p.MaxSessions = cmp.Or(p.MaxSessions, def.MaxSessions)
	p.MemoryBytes = cmp.Or(p.MemoryBytes, def.MemoryBytes)
	p.FilesBytes = cmp.Or(p.FilesBytes, def.FilesBytes)
	p.MaxFileBytes = cmp.Or(p.MaxFileBytes, def.MaxFileBytes)
	p.MaxJobFilesBytes = cmp.Or(p.MaxJobFilesBytes, def.MaxJobFilesBytes)
	p.MaxFiles = cmp.Or(p.MaxFiles, def.MaxFiles)
	if p.Tools == nil {
		p.Tools = def.Tools
	}
	if p.ToolDefaults == nil {
		p.ToolDefaults = def.ToolDefaults
	}
	p.ApprovalTimeout = cmp.Or(p.ApprovalTimeout, def.ApprovalTimeout)
	p.MaxPendingApprovalsPerJob = cmp.Or(p.MaxPendingApprovalsPerJob, def.MaxPendingApprovalsPerJob)
	p.MaxPendingApprovals = cmp.Or(p.MaxPendingApprovals, def.MaxPendingApprovals)
	return p
}

// Enabled reports whether a job cap is set.
func (p Policy) Enabled() bool { return p.MaxQueued > 0 || p.MaxActive > 0 || p.MaxQueuedBytes > 0 }

// Validate reports the first field out of range.
func (p Policy) Validate() error {
	switch {
	case p.MaxTimeout < 0, p.MaxQueued < 0, p.MaxActive < 0, p.MaxQueuedBytes < 0, p.MaxSessions < 0, p.MemoryBytes < 0, p.MaxMemoryMB < 0, p.MaxCPUs < 0,
		p.FilesBytes < 0, p.MaxFileBytes < 0, p.MaxJobFilesBytes < 0, p.MaxFiles < 0,
		p.ApprovalTimeout < 0, p.MaxPendingApprovalsPerJob < 0, p.MaxPendingApprovals < 0:
		return fmt.Errorf("policy caps must not be negative: %+v", p)
	case p.MaxTimeout > 24*3600:
		return fmt.Errorf("policy max_timeout %d is over a day", p.MaxTimeout)
	case p.MaxFileBytes > jobs.HardMaxFileBytes:
		return fmt.Errorf("policy max_file_bytes %d is over %d (a file travels in one message)", p.MaxFileBytes, jobs.HardMaxFileBytes)
	case p.MaxJobFilesBytes > jobs.HardMaxJobBytes:
		return fmt.Errorf("policy max_job_files_bytes %d is over %d", p.MaxJobFilesBytes, jobs.HardMaxJobBytes)
	case p.MaxFiles > jobs.HardMaxFiles:
		return fmt.Errorf("policy max_files %d is over %d", p.MaxFiles, jobs.HardMaxFiles)
	case p.ApprovalTimeout > MaxApprovalTimeout:
		return fmt.Errorf("policy approval_timeout %d is over %d seconds", p.ApprovalTimeout, MaxApprovalTimeout)
	}
	if _, err := p.ToolRules(); err != nil {
		return fmt.Errorf("policy %w", err)
	}
	if p.Redact != nil {
		if err := p.Redact.Validate(); err != nil {
			return fmt.Errorf("policy %w", err)
		}
	}
	for _, pool := range p.Pools {
		if !jobs.ValidID(pool) {
			return fmt.Errorf("policy pool %q: use letters, digits, '-' or '_'", pool)
		}
	}
	return nil
}

// allowsServer reports whether the namespace may use server.
func (p Policy) allowsServer(server string) bool {
	return len(p.Servers) == 0 || slices.Contains(p.Servers, server)
}

// allowsPool reports whether the namespace may send jobs to pool.
func (p Policy) allowsPool(pool string) bool {
	return len(p.Pools) == 0 || slices.Contains(p.Pools, pool)
}

// redactor returns namespace ns's compiled redaction (compiled once per
// namespace: policies do not change while the front-end runs).
func (f *Frontend) redactor(ns string) *audit.Redactor {
	if x, ok := f.redactors.Load(ns); ok {
		return x.(*audit.Redactor)
	}
	x := audit.DefaultRedactor
	if r := f.policyFor(ns).Redact; r != nil {
		if c, err := r.Compile(); err == nil { // Validate checked it at start
			x = c
		}
	}
	f.redactors.Store(ns, x)
	return x
}

// policyFor returns namespace ns's policy.
func (f *Frontend) policyFor(ns string) Policy {
	if p, ok := f.cfg.Policies[jobs.NamespaceOf(ns)]; ok {
		return p
	}
	return f.cfg.Policy
}

// LimitsFor returns the submission limits of namespace ns: the front-end's,
// with the namespace's own maximum timeout.
func (f *Frontend) LimitsFor(ns string) jobs.Limits {
	l := f.cfg.Limits
	p := f.policyFor(ns)
	if p.MaxTimeout > 0 {
		l.MaxTimeout = p.MaxTimeout
	}
	if p.MaxMemoryMB > 0 {
		l.MaxMemoryMB = p.MaxMemoryMB
	}
	if p.MaxCPUs > 0 {
		l.MaxCPUs = p.MaxCPUs
	}
	return l
}

// prepare validates a caller's job for namespace ns and makes it a wire job:
// defaults filled, the namespace's policy applied, ids scoped.
func (f *Frontend) prepare(job *jobs.Job, ns string) error {
	ns = jobs.NamespaceOf(ns)
	if err := job.Normalize(f.LimitsFor(ns), timeNow()); err != nil {
		return err
	}
	p := f.policyFor(ns)
	var refused []string
	for _, s := range job.Servers {
		if !p.allowsServer(s) {
			refused = append(refused, s)
		}
	}
	if len(refused) > 0 {
		return &jobs.InvalidError{Field: "servers", Message: fmt.Sprintf("namespace %q may not use %s (it may use %s)",
			ns, strings.Join(refused, ", "), strings.Join(p.Servers, ", "))}
	}
	if !p.allowsPool(job.Pool) {
		return &jobs.InvalidError{Field: "pool", Message: fmt.Sprintf("namespace %q may not use pool %q (it may use %s)",
			ns, job.Pool, strings.Join(p.Pools, ", "))}
	}
	job.Namespace, job.Frontend = ns, f.cfg.ID
	job.ID = jobs.ScopedID(ns, job.ID)
	if job.RetryOf != "" {
		job.RetryOf = jobs.ScopedID(ns, job.RetryOf)
	}
	job.After, job.AfterAny = jobs.ScopeAll(ns, job.After), jobs.ScopeAll(ns, job.AfterAny)
	return nil
}
