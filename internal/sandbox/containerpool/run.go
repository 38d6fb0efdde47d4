package containerpool

// This file runs jobs: in a container of their namespace, a warm one or a
// new one, or in their session's.
import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Run implements sandbox.Runtime.
func (p *Pool) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	p.js.Saw(job)
	p.data.Saw(job)
	l := p.limitsFor(job)
	reuse := p.cfg.Reuse == ReuseNamespace && job.Tenant != "" && l == p.cfg.Limits
	var b *Box
	if reuse {
		var release func()
		b, release = p.takeIdle(job.Tenant, job.Language)
		defer release()
	}
	if b == nil {
		var err error
		if b, err = p.Acquire(ctx, job.ID, l); err != nil {
			return sandbox.Result{}, err
		}
	}
	job.Fresh = true
	res, err := p.drive(ctx, b, job, host)
	if errors.Is(err, sandbox.ErrNotRun) {
		// A reused container answers a job before its sweep; the sweep found
		// damage, and it retired without running this one: a new one does.
		p.Discard(b)
		if b, err = p.Acquire(ctx, job.ID, l); err != nil {
			return sandbox.Result{}, err
		}
		res, err = p.drive(ctx, b, job, host)
	}
	b.uses++
	if reuse && err == nil && res.Status != sandbox.StatusTimeout && b.rc.Resets() && b.rc.Idle() && b.uses < p.cfg.MaxUses {
		b.tenant = job.Tenant
		p.putIdle(b)
		return res, nil
	}
	if reuse {
		p.log.Debug(p.name+": container not kept for its namespace", "id", sandbox.ShortID(b.id), "status", res.Status, "err", err,
			"runner_reusable", b.rc.Reusable(), "runner_idle", b.rc.Idle(), "uses", b.uses)
	}
	p.Discard(b)
	return res, err
}

// drive runs job on b within the job's time limit. The caller decides whether
// b may serve again (b.rc.Reusable) or must be discarded.
func (p *Pool) drive(ctx context.Context, b *Box, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	if job.OnSandbox != nil {
		job.OnSandbox(sandbox.ShortID(b.id))
	}
	direct := b.rc.DirectExecs()
	res, err := b.rc.Exec(ctx, job, host)
	p.direct.Add(b.rc.DirectExecs() - direct)
	if errors.Is(err, sandbox.ErrRunnerLost) {
		res = p.eng.Lost(b, res)
		err = nil
	}
	// The code's process killed by SIGKILL: from inside the container only the
	// kernel's OOM killer does that (the code cannot signal the runner, PID 1).
	if err == nil && res.ExitCode == 137 && !b.rc.Reusable() && b.limits.Memory > 0 {
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and the code's process was killed", sandbox.FormatBytes(b.limits.Memory))
	}
	return res, err
}

// limitsFor returns the limits of job's sandbox: the configured ones, with
// the job's own memory and CPUs when it asks for them.
func (p *Pool) limitsFor(job sandbox.Job) sandbox.Limits {
	l := p.cfg.Limits
	if job.Memory > 0 {
		l.Memory = job.Memory
	}
	if job.CPUs > 0 {
		l.CPUs = job.CPUs
	}
	return l
}

// RunInSession implements sandbox.SessionRuntime.
func (p *Pool) RunInSession(ctx context.Context, key string, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	p.js.Saw(job)
	p.data.Saw(job)
	return p.sessions.Run(ctx, key, job, host)
}

// HasSession implements sandbox.SessionRuntime.
func (p *Pool) HasSession(key string) bool { return p.sessions.Has(key) }

// EndSession implements sandbox.SessionRuntime. A job of the session that is
// running finishes first; its container is removed afterwards.
func (p *Pool) EndSession(key string) error {
	p.sessions.End(key)
	return nil
}

// Probe implements sandbox.Prober: it starts a container and removes it.
func (p *Pool) Probe(ctx context.Context) error {
	b, err := p.Acquire(ctx, "probe", p.cfg.Limits)
	if err != nil {
		return err
	}
	p.Discard(b)
	return nil
}

var (
	_ sandbox.Prober        = (*Pool)(nil)
	_ sandbox.StatsReporter = (*Pool)(nil)
)
