package containerpool

// This file starts and removes containers and keeps the warm pool and the
// containers idle for their namespace's next job.
import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Box is one started container whose runner completed its handshake.
type Box struct {
	tenant   string         // the namespace it served (reused boxes)
	uses     int            // jobs it ran
	idleFrom time.Time      // when it went idle
	limits   sandbox.Limits // its container's
	id       string
	dir      string
	ln       net.Listener
	rc       *sandbox.RunnerConn
}

// ID is the box's container id.
func (b *Box) ID() string { return b.id }

// Limits are the box's container's.
func (b *Box) Limits() sandbox.Limits { return b.limits }

// Pool starts containers through an Engine and keeps them: warm ones for
// any job, idle ones for their namespace's next job, and sessions'. It is
// safe for concurrent use.
type Pool struct {
	name string // starts log messages and errors ("podman sandbox")
	cfg  Config
	eng  Engine
	log  *slog.Logger
	base string                // the Pool's own directory under RunDir
	js   sandbox.JSExpectation // when new sandboxes keep a JavaScript executor ready
	// data is when new sandboxes start their data zygote before their
	// first job (else at their first job that uses the data stack).
	data *sandbox.DataExpectation

	errClosed error // ErrClosed, with the name

	seq           atomic.Uint64
	started       atomic.Uint64 // containers whose runner completed its handshake
	startFailures atomic.Uint64 // containers that failed to start
	direct        atomic.Uint64 // jobs sent straight to their container's spare

	mu       sync.Mutex // guards warm, idle, idleN, inUse, starting, running, closed
	warm     []*Box
	idle     map[string][]*Box // by tenant, least recently used first
	idleN    int
	inUse    map[string]int // by tenant, its jobs running in reused containers (takeIdle to release)
	starting int
	running  bool // Start started the filler and the reaper
	closed   bool
	sessions *sandbox.Sessions[*Box]

	wake       chan struct{} // pokes the pool filler
	stop       chan struct{} // closed by Close
	fillerDone chan struct{}
	reaperDone chan struct{}  // closed when reapLoop returns
	removals   sync.WaitGroup // background container removals
	closeOnce  sync.Once
}

// New makes the Pool's directory under cfg.RunDir; cfg has its defaults
// (Config.SetDefaults), name starts the Pool's log messages and errors.
// Start starts the pool's filler and reaper.
func New(name string, cfg Config, eng Engine) (*Pool, error) {
	base, err := cfg.privateDir(name)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		name:       name,
		errClosed:  fmt.Errorf("%s: %w", name, ErrClosed),
		cfg:        cfg,
		eng:        eng,
		log:        cfg.Logger,
		base:       base,
		data:       sandbox.NewDataExpectation(cfg.Preload),
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		fillerDone: make(chan struct{}),
		reaperDone: make(chan struct{}),
	}
	p.sessions = &sandbox.Sessions[*Box]{
		Start:     func(ctx context.Context) (*Box, error) { return p.Acquire(ctx, "session", p.cfg.Limits) },
		Drive:     p.drive,
		Reusable:  func(b *Box) bool { return b.rc.Reusable() },
		Discard:   p.Discard,
		ErrClosed: p.errClosed,
	}
	return p, nil
}

// Limits are the configured limits of its containers.
func (p *Pool) Limits() sandbox.Limits { return p.cfg.Limits }

// Dir is the Pool's own directory: one directory per container under it.
func (p *Pool) Dir() string { return p.base }

// Start starts the pool's filler and the reaper of idle containers and of
// containers whose owner is gone. Close stops them.
func (p *Pool) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.running {
		return
	}
	p.running = true
	go p.fill()
	go p.reapLoop()
}

// Close ends every session and discards every container the Pool holds,
// and returns when all are removed. It is idempotent and safe before Start.
func (p *Pool) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		running := p.running
		warm := p.warm
		p.warm = nil
		for _, bs := range p.idle {
			warm = append(warm, bs...)
		}
		p.idle, p.idleN = nil, 0
		p.mu.Unlock()
		p.sessions.Close()
		close(p.stop)
		if running {
			<-p.fillerDone
			<-p.reaperDone
		}
		for _, b := range warm {
			p.Discard(b)
		}
		p.removals.Wait()
	})
}

// WaitRemovals waits for the removals Discard started.
func (p *Pool) WaitRemovals() { p.removals.Wait() }

// Discard closes a box and removes its container in the background.
func (p *Pool) Discard(b *Box) {
	p.removals.Add(1)
	go func() {
		defer p.removals.Done()
		// Closing the connection makes the runner exit by itself (within
		// milliseconds, even mid-job): the removal then finds a stopped container
		// and needs no kill (a runc process and a SIGKILL fewer). A runner that
		// does not exit in time is killed by the forced removal.
		b.rc.Finish(finishTimeout)
		if err := p.eng.Remove(context.Background(), b.id); err != nil {
			p.log.Error(p.name+": remove container", "id", sandbox.ShortID(b.id), "err", err)
		}
		_ = b.ln.Close()        // the container is gone: nothing connects any more
		_ = os.RemoveAll(b.dir) // best effort: the Pool's directory goes at Close
	}()
}

// NewBox creates and starts a container labelled jobLabel, of limits l, and
// waits for its runner's hello: a cold start, whatever the pool holds.
func (p *Pool) NewBox(ctx context.Context, jobLabel string, l sandbox.Limits) (_ *Box, err error) {
	n := p.seq.Add(1)
	dir := filepath.Join(p.base, strconv.FormatUint(n, 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create container dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // umask
		return nil, err
	}
	b := &Box{dir: dir, limits: l}
	defer func() {
		if err == nil {
			p.started.Add(1)
			return
		}
		p.startFailures.Add(1)
		if b.ln != nil {
			_ = b.ln.Close() // the start failed: err is what the caller hears
		}
		if b.id != "" {
			_ = p.eng.Remove(ctx, b.id) // best effort: Close and the reaper remove what is left
		}
		_ = os.RemoveAll(dir) // best effort: the Pool's directory goes at Close
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
	b.id, err = p.eng.Create(ctx, Spec{Dir: dir, Job: jobLabel, Seq: n, Limits: l, Secret: secret, SpareJavaScript: p.js.Expected(),
		Preload: p.cfg.Preload, PreloadLazy: len(p.cfg.Preload) > 0 && !p.data.Expected()})
	if err != nil {
		return nil, err
	}

	hctx, hcancel := context.WithTimeout(ctx, handshakeTimeout)
	defer hcancel()
	if b.rc, err = sandbox.AcceptRunner(hctx, ln, p.cfg.MaxFrame, secret); err != nil {
		return nil, fmt.Errorf("container %s: %w%s", sandbox.ShortID(b.id), err, p.eng.ExitNote(b.id))
	}
	return b, nil
}

// take returns a warm box, or nil.
func (p *Pool) take() *Box {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeWarmLocked()
}

// takeWarmLocked returns a warm box, or nil; p.mu is held.
func (p *Pool) takeWarmLocked() *Box {
	if len(p.warm) == 0 {
		return nil
	}
	b := p.warm[0]
	p.warm = p.warm[1:]
	p.poke()
	return b
}

// takeIdle returns a box for a job of tenant in lang, in this order:
//   - the most recently used idle box of tenant armed for lang (swept, an
//     executor of lang started); for Python, one without a JavaScript
//     executor first (a Python job ends that executor unused);
//   - a warm box, when the tenant has fewer idle boxes than rearming(lang),
//     holds fewer than MaxIdlePerTenant in all (idle and running its jobs),
//     the pool has one and MaxIdle leaves room for it: it stays with the
//     tenant, so that a tenant calling back to back holds two boxes, one
//     armed while the other re-arms, or for JavaScript three (the refill
//     costs one container start, once). Past MaxIdlePerTenant, putIdle
//     would discard a box when the tenant's calls pause, and the next warm
//     box taken would cost a container start again: four clients of one
//     namespace calling back to back started three containers a second;
//   - the least recently used idle box of tenant: it has re-armed longest,
//     and starts the job once it is armed.
//
// Or nil. Boxes past IdleTTL, or whose runner spoke or went while idle, are
// discarded. The caller's job counts as running its tenant's until it
// calls release.
func (p *Pool) takeIdle(tenant, lang string) (_ *Box, release func()) {
	var stale []*Box
	defer func() {
		for _, b := range stale {
			p.Discard(b)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inUse == nil {
		p.inUse = map[string]int{}
	}
	running := p.inUse[tenant]
	p.inUse[tenant]++
	release = func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.inUse[tenant]--; p.inUse[tenant] <= 0 {
			delete(p.inUse, tenant)
		}
	}
	var fit []*Box
	for _, b := range p.idle[tenant] {
		if time.Since(b.idleFrom) > p.cfg.IdleTTL || !b.rc.Idle() {
			stale = append(stale, b)
			p.idleN--
			continue
		}
		fit = append(fit, b)
	}
	pick := -1
	for pass := 0; pass < 2 && pick < 0; pass++ {
		for i := len(fit) - 1; i >= 0 && pick < 0; i-- {
			rc := fit[i].rc
			if rc.ArmedFor(lang) && (pass == 1 || lang == sandbox.JavaScript || !rc.ArmedFor(sandbox.JavaScript)) {
				pick = i
			}
		}
	}
	if pick < 0 && len(fit) < rearming(lang) && len(fit)+running < p.cfg.MaxIdlePerTenant && p.idleN < p.cfg.MaxIdle {
		if b := p.takeWarmLocked(); b != nil {
			p.setIdle(tenant, fit)
			return b, release
		}
	}
	if pick < 0 && len(fit) > 0 {
		pick = 0
	}
	if pick < 0 {
		p.setIdle(tenant, fit)
		return nil, release
	}
	b := fit[pick]
	p.setIdle(tenant, slices.Delete(fit, pick, pick+1))
	p.idleN--
	return b, release
}

// rearming is how many idle boxes a tenant holds before a job of lang
// that finds none armed waits for one rather than take a warm box. A
// Python box re-arms (sweep, a fork of the zygote, its warm-up) in 15-25
// ms, within a back-to-back call: two boxes take turns. A JavaScript box
// re-arms by starting Node (40-70 ms of CPU here), longer than a call,
// and longer still while calls of either language keep the CPUs busy: with
// two, nearly every call back to back, or alternating with Python, waited
// for a Node start. A third gives each two calls' time.
func rearming(lang string) int {
	if lang == sandbox.JavaScript {
		return 3
	}
	return 2
}

func (p *Pool) setIdle(tenant string, bs []*Box) {
	if len(bs) == 0 {
		delete(p.idle, tenant)
		return
	}
	p.idle[tenant] = bs
}

// putIdle keeps b for its tenant's next job, within the idle bounds (the
// least recently used box of the tenant, or of all, makes room).
func (p *Pool) putIdle(b *Box) {
	var out []*Box
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.Discard(b)
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*Box{}
	}
	b.idleFrom = time.Now()
	bs := append(p.idle[b.tenant], b)
	p.idleN++
	if len(bs) > p.cfg.MaxIdlePerTenant {
		out, bs = append(out, bs[0]), bs[1:]
		p.idleN--
	}
	p.idle[b.tenant] = bs
	for p.idleN > p.cfg.MaxIdle {
		var oldest string
		for t, tbs := range p.idle {
			if oldest == "" || tbs[0].idleFrom.Before(p.idle[oldest][0].idleFrom) {
				oldest = t
			}
		}
		out = append(out, p.idle[oldest][0])
		p.setIdle(oldest, p.idle[oldest][1:])
		p.idleN--
	}
	p.mu.Unlock()
	for _, o := range out {
		p.Discard(o)
	}
}

// retireIdle discards the idle boxes past IdleTTL.
func (p *Pool) retireIdle() {
	var out []*Box
	p.mu.Lock()
	for t, bs := range p.idle {
		keep := bs[:0]
		for _, b := range bs {
			if time.Since(b.idleFrom) > p.cfg.IdleTTL {
				out = append(out, b)
				p.idleN--
			} else {
				keep = append(keep, b)
			}
		}
		p.setIdle(t, keep)
	}
	p.mu.Unlock()
	for _, b := range out {
		p.Discard(b)
	}
}

// Idle returns how many containers wait for their namespace's next job.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleN
}

// Armed is how many of tenant's idle containers are armed (swept, the next
// job's process started): a job of tenant sent now takes one of them.
func (p *Pool) Armed(tenant string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.idle[tenant] {
		if b.rc.Armed() {
			n++
		}
	}
	return n
}

// Warm returns how many started containers wait in the pool.
func (p *Pool) Warm() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.warm)
}

// Stats implements sandbox.StatsReporter.
func (p *Pool) Stats() sandbox.Stats {
	return sandbox.Stats{Started: p.started.Load(), StartFailures: p.startFailures.Load(), Warm: p.Warm(), Direct: p.direct.Load()}
}

// poke wakes the pool filler.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps cfg.Pool warm containers ready until Close. It starts up to
// cfg.Pool containers at once: a batch of jobs drains the pool as fast as the
// worker's slots take containers, and one start at a time would leave the slots
// starting containers themselves.
func (p *Pool) fill() {
	defer close(p.fillerDone)
	if p.cfg.Pool == 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan error, p.cfg.Pool) // each start's outcome
	backoff := time.Duration(0)
	for {
		p.mu.Lock()
		need := !p.closed && len(p.warm)+p.starting < p.cfg.Pool
		if need {
			p.starting++
		}
		p.mu.Unlock()
		if need {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := p.fillOne()
				select {
				case results <- err:
				case <-p.stop:
				}
			}()
			continue
		}
		select {
		case <-p.stop:
			return
		case <-p.wake:
		case err := <-results:
			if err == nil {
				backoff = 0
				continue
			}
			select {
			case <-p.stop:
				return
			default:
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			p.log.Error(p.name+": start warm container", "err", err, "retry_in", backoff)
			select {
			case <-p.stop:
				return
			case <-time.After(backoff):
			}
		}
	}
}

// fillOne starts one warm container (p.starting counts it already) and adds it
// to the pool.
func (p *Pool) fillOne() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	b, err := p.NewBox(ctx, "pool", p.cfg.Limits)
	p.mu.Lock()
	p.starting--
	keep := err == nil && !p.closed
	if keep {
		p.warm = append(p.warm, b)
	}
	p.mu.Unlock()
	if err == nil && !keep {
		p.Discard(b)
	}
	return err
}

// Acquire returns a warm box, or starts one labelled with label; a box of
// other limits than the configured ones is always started for the caller.
func (p *Pool) Acquire(ctx context.Context, label string, l sandbox.Limits) (*Box, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, p.errClosed
	}
	if l == p.cfg.Limits {
		if b := p.take(); b != nil {
			return b, nil
		}
	}
	if label == "" {
		label = "job"
	}
	b, err := p.NewBox(ctx, label, l)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", p.name, context.Cause(ctx))
		}
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	return b, nil
}
