package docker

// This file starts and removes containers and keeps the warm pool and the
// containers idle for their namespace's next job (as the Podman runtime does).
import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// remove kills and removes a container, whatever its state; a container that
// is gone already is no error.
func (r *Runtime) remove(ctx context.Context, id string) error {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = r.cli.ContainerRemove(c, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || client.IsErrNotFound(err) {
			return nil
		}
		if c.Err() != nil {
			break
		}
		// "removal of container ... is already in progress" and the like.
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return err
}

// discard closes a box and removes its container in the background.
func (r *Runtime) discard(b *box) {
	r.removals.Add(1)
	go func() {
		defer r.removals.Done()
		// Closing the connection makes the runner exit by itself (within
		// milliseconds, even mid-job): the removal then finds a stopped
		// container. A runner that does not exit in time is killed by the
		// forced removal.
		b.rc.Finish(finishTimeout)
		if err := r.remove(context.Background(), b.id); err != nil {
			r.log.Error("docker sandbox: remove container", "id", sandbox.ShortID(b.id), "err", err)
		}
		_ = b.ln.Close()        // discarding the box: a failed close leaves nothing to do
		_ = os.RemoveAll(b.dir) // best effort: the Runtime's directory goes at Close
	}()
}

// start creates and starts a container and waits for its runner's hello.
func (r *Runtime) start(ctx context.Context, jobLabel string, l sandbox.Limits) (_ *box, err error) {
	n := r.seq.Add(1)
	dir := filepath.Join(r.base, strconv.FormatUint(n, 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create container dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // umask
		return nil, err
	}
	b := &box{dir: dir, limits: l}
	defer func() {
		if err == nil {
			r.started.Add(1)
			return
		}
		r.startFailures.Add(1)
		if b.ln != nil {
			_ = b.ln.Close() // discarding the box: a failed close leaves nothing to do
		}
		if b.id != "" {
			_ = r.remove(ctx, b.id) // best effort: Close and the reaper remove what is left
		}
		_ = os.RemoveAll(dir) // best effort: the Runtime's directory goes at Close
	}()
	if err := sandbox.WriteRunner(dir); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen for runner: %w", err)
	}
	b.ln = ln
	if err := os.Chmod(sock, 0o777); err != nil { // the container's user must connect
		return nil, err
	}

	secret := sandbox.NewSecret()
	s := r.spec(dir, jobLabel, n, l, secret)
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	created, err := r.cli.ContainerCreate(c, s.config, s.host, s.net, nil, s.name)
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	b.id = created.ID
	for _, w := range created.Warnings {
		// A limit the engine cannot apply (Info.Missing says which).
		r.log.Warn("docker sandbox: create container", "warning", w)
	}
	if err := r.cli.ContainerStart(c, b.id, container.StartOptions{}); err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}

	hctx, hcancel := context.WithTimeout(ctx, handshakeTimeout)
	defer hcancel()
	if b.rc, err = sandbox.AcceptRunner(hctx, ln, r.cfg.MaxFrame, secret); err != nil {
		return nil, fmt.Errorf("container %s: %w%s", sandbox.ShortID(b.id), err, r.exitNote(b.id))
	}
	return b, nil
}

// take returns a warm box, or nil.
func (r *Runtime) take() *box {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.warm) == 0 {
		return nil
	}
	b := r.warm[0]
	r.warm = r.warm[1:]
	r.poke()
	return b
}

// takeIdle returns the most recently used idle box of tenant that is still
// fit for a job, or nil. Boxes past IdleTTL, or whose runner spoke or went
// while idle, are discarded.
func (r *Runtime) takeIdle(tenant string) *box {
	var stale []*box
	defer func() {
		for _, b := range stale {
			r.discard(b)
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	bs := r.idle[tenant]
	for len(bs) > 0 {
		b := bs[len(bs)-1]
		bs = bs[:len(bs)-1]
		r.idleN--
		if time.Since(b.idleFrom) > r.cfg.IdleTTL || !b.rc.Idle() {
			stale = append(stale, b)
			continue
		}
		r.setIdle(tenant, bs)
		return b
	}
	r.setIdle(tenant, bs)
	return nil
}

func (r *Runtime) setIdle(tenant string, bs []*box) {
	if len(bs) == 0 {
		delete(r.idle, tenant)
		return
	}
	r.idle[tenant] = bs
}

// putIdle keeps b for its tenant's next job, within the idle bounds (the
// least recently used box of the tenant, or of all, makes room).
func (r *Runtime) putIdle(b *box) {
	var out []*box
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.discard(b)
		return
	}
	if r.idle == nil {
		r.idle = map[string][]*box{}
	}
	b.idleFrom = time.Now()
	bs := append(r.idle[b.tenant], b)
	r.idleN++
	if len(bs) > r.cfg.MaxIdlePerTenant {
		out, bs = append(out, bs[0]), bs[1:]
		r.idleN--
	}
	r.idle[b.tenant] = bs
	for r.idleN > r.cfg.MaxIdle {
		var oldest string
		for t, tbs := range r.idle {
			if oldest == "" || tbs[0].idleFrom.Before(r.idle[oldest][0].idleFrom) {
				oldest = t
			}
		}
		out = append(out, r.idle[oldest][0])
		r.setIdle(oldest, r.idle[oldest][1:])
		r.idleN--
	}
	r.mu.Unlock()
	for _, o := range out {
		r.discard(o)
	}
}

// retireIdle discards the idle boxes past IdleTTL.
func (r *Runtime) retireIdle() {
	var out []*box
	r.mu.Lock()
	for t, bs := range r.idle {
		keep := bs[:0]
		for _, b := range bs {
			if time.Since(b.idleFrom) > r.cfg.IdleTTL {
				out = append(out, b)
				r.idleN--
			} else {
				keep = append(keep, b)
			}
		}
		r.setIdle(t, keep)
	}
	r.mu.Unlock()
	for _, b := range out {
		r.discard(b)
	}
}

// Idle returns how many containers wait for their namespace's next job.
func (r *Runtime) Idle() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idleN
}

// poke wakes the pool filler.
func (r *Runtime) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// fill keeps cfg.Pool warm containers ready until Close. It starts up to
// cfg.Pool containers at once: a batch of jobs drains the pool as fast as the
// worker's slots take containers, and one start at a time would leave the slots
// starting containers themselves.
func (r *Runtime) fill() {
	defer close(r.fillerDone)
	if r.cfg.Pool == 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan error, r.cfg.Pool) // each start's outcome
	backoff := time.Duration(0)
	for {
		r.mu.Lock()
		need := !r.closed && len(r.warm)+r.starting < r.cfg.Pool
		if need {
			r.starting++
		}
		r.mu.Unlock()
		if need {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := r.fillOne()
				select {
				case results <- err:
				case <-r.stop:
				}
			}()
			continue
		}
		select {
		case <-r.stop:
			return
		case <-r.wake:
		case err := <-results:
			if err == nil {
				backoff = 0
				continue
			}
			select {
			case <-r.stop:
				return
			default:
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			r.log.Error("docker sandbox: start warm container", "err", err, "retry_in", backoff)
			select {
			case <-r.stop:
				return
			case <-time.After(backoff):
			}
		}
	}
}

// fillOne starts one warm container (r.starting counts it already) and adds it
// to the pool.
func (r *Runtime) fillOne() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	b, err := r.start(ctx, "pool", r.cfg.Limits)
	r.mu.Lock()
	r.starting--
	keep := err == nil && !r.closed
	if keep {
		r.warm = append(r.warm, b)
	}
	r.mu.Unlock()
	if err == nil && !keep {
		r.discard(b)
	}
	return err
}

// acquire returns a warm box, or starts one labelled with label; a box of
// other limits than the configured ones is always started for the caller.
func (r *Runtime) acquire(ctx context.Context, label string, l sandbox.Limits) (*box, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if l == r.cfg.Limits {
		if b := r.take(); b != nil {
			return b, nil
		}
	}
	if label == "" {
		label = "job"
	}
	b, err := r.start(ctx, label, l)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("docker sandbox: %w", context.Cause(ctx))
		}
		return nil, fmt.Errorf("docker sandbox: %w", err)
	}
	return b, nil
}

// Stats implements sandbox.StatsReporter.
func (r *Runtime) Stats() sandbox.Stats {
	return sandbox.Stats{Started: r.started.Load(), StartFailures: r.startFailures.Load(), Warm: r.Warm()}
}

// Warm returns how many started containers wait in the pool.
func (r *Runtime) Warm() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.warm)
}
