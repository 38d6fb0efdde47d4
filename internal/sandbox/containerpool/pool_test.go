package containerpool_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// fakeEngine plays a container engine whose containers' runners are
// goroutines speaking the runner protocol: a job prints its container's id,
// code "lose" drops the connection mid-job, code "last" retires the runner.
type fakeEngine struct {
	failCreate bool // Create fails after creating the container

	mu       sync.Mutex // guards n, live, removed, created, commands
	n        int
	live     map[string]*fakeContainer
	removed  []string
	created  int
	commands [][]string // each container's command, in the order created
}

type fakeContainer struct {
	labels map[string]string
	conn   net.Conn
}

var _ containerpool.Engine = (*fakeEngine)(nil)

func (e *fakeEngine) Create(_ context.Context, s containerpool.Spec) (string, error) {
	e.mu.Lock()
	e.n++
	e.created++
	e.commands = append(e.commands, s.Command())
	id := fmt.Sprintf("c%d-%s", e.n, strings.Repeat("0", 12))
	c := &fakeContainer{labels: map[string]string{
		containerpool.LabelManaged: "true", containerpool.LabelJob: s.Job,
		containerpool.LabelWorker: "w", containerpool.LabelOwner: sandbox.OwnerLabel,
	}}
	if e.live == nil {
		e.live = map[string]*fakeContainer{}
	}
	e.live[id] = c
	fail := e.failCreate
	e.mu.Unlock()
	if fail {
		return id, errors.New("start container: no")
	}
	conn, err := net.Dial("unix", filepath.Join(s.Dir, "s"))
	if err != nil {
		return id, err
	}
	e.mu.Lock()
	c.conn = conn
	e.mu.Unlock()
	go runner(conn, id, s.Secret)
	return id, nil
}

// holds are the channels that jobs of code "hold:NAME" wait on, by NAME.
var holds sync.Map

// runner is a container's runner: PID 1 that resets its container.
func runner(conn net.Conn, id, secret string) {
	defer func() { _ = conn.Close() }() // the runner is done
	r, w := proxy.NewReader(conn, 0), proxy.NewWriter(conn, 0)
	if w.Write(&proxy.Frame{Type: proxy.TypeHello, Version: 1, Secret: secret, Reset: true, Isolated: true}) != nil {
		return
	}
	for {
		f, err := r.Read()
		if err != nil || f.Type != proxy.TypeExec {
			return
		}
		if name, ok := strings.CutPrefix(f.Code, "hold:"); ok {
			// Runs until the test closes the channel held under name.
			if ch, ok := holds.Load(name); ok {
				<-ch.(chan struct{})
			}
		}
		switch f.Code {
		case "lose":
			return
		case "last":
			_ = w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: f.Job, Status: "success", Last: true})
			continue
		}
		_ = w.Write(&proxy.Frame{Type: proxy.TypeOut, Job: f.Job, Stream: "stdout", Data: id})
		_ = w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: f.Job, Status: "success"})
		// "ready:LANG,...": swept, with executors of those languages waiting.
		if spares, ok := strings.CutPrefix(f.Code, "ready:"); ok {
			_ = w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: strings.Split(spares, ",")})
		}
	}
}

func (e *fakeEngine) Remove(_ context.Context, id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.live[id]; c != nil {
		if c.conn != nil {
			_ = c.conn.Close() // the container is gone with its runner
		}
		delete(e.live, id)
		e.removed = append(e.removed, id)
	}
	return nil
}

func (e *fakeEngine) List(_ context.Context, labels ...string) ([]containerpool.Container, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var cs []containerpool.Container
	for id, c := range e.live {
		ok := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			ok = ok && c.labels[k] == v
		}
		if ok {
			cs = append(cs, containerpool.Container{ID: id, Labels: c.labels})
		}
	}
	return cs, nil
}

func (e *fakeEngine) ExitNote(string) string { return " (container exited)" }

func (e *fakeEngine) Lost(b *containerpool.Box, res sandbox.Result) sandbox.Result {
	res.Status, res.ExitCode, res.Error = sandbox.StatusError, -1, "lost "+b.ID()
	return res
}

// add puts a container in the engine as another process left it.
func (e *fakeEngine) add(id string, labels map[string]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.live == nil {
		e.live = map[string]*fakeContainer{}
	}
	e.live[id] = &fakeContainer{labels: labels}
}

func (e *fakeEngine) createdN() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.created
}

func (e *fakeEngine) liveN() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.live)
}

// setup returns a started Pool of cfg over a fake engine, closed when the
// test ends.
func setup(t *testing.T, cfg containerpool.Config) (*containerpool.Pool, *fakeEngine) {
	t.Helper()
	cfg.WorkerID, cfg.RunDir = "w", filepath.Join(t.TempDir(), "run")
	if err := cfg.SetDefaults("fake sandbox"); err != nil {
		t.Fatal(err)
	}
	e := &fakeEngine{}
	p, err := containerpool.New("fake sandbox", cfg, e)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(p.Close)
	return p, e
}

// run runs code for tenant and returns the id of the container it ran in.
func run(t *testing.T, p *containerpool.Pool, tenant, code string) string {
	t.Helper()
	res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: tenant, Code: code, Timeout: 5 * time.Second}, nil)
	if err != nil || res.Status != sandbox.StatusSuccess {
		t.Fatalf("run %q for %q: %v %+v", code, tenant, err, res)
	}
	return res.Stdout
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// TestDataZygoteLazyUntilUsed: with preload modules, containers start
// their data zygote at their first job that uses the data stack
// (--preload-lazy) until such a job comes; those started after it do so
// before their first job.
func TestDataZygoteLazyUntilUsed(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{Pool: 1, Reuse: containerpool.ReuseNone, Preload: sandbox.DefaultPreload})
	eventually(t, "1 warm", func() bool { return p.Warm() == 1 })
	run(t, p, "", "print(1)")
	eventually(t, "the pool refills", func() bool { return p.Warm() == 1 })
	run(t, p, "", "import pandas as pd\nprint(pd.__version__)")
	eventually(t, "the pool refills", func() bool { return p.Warm() == 1 })
	e.mu.Lock()
	cmds := slices.Clone(e.commands)
	e.mu.Unlock()
	lazy := func(cmd []string) bool { return slices.Contains(cmd, "--preload-lazy") }
	if len(cmds) < 3 || !slices.Contains(cmds[0], "--preload=numpy,pandas,matplotlib.pyplot") {
		t.Fatalf("commands %q: want three with the preload", cmds)
	}
	if !lazy(cmds[0]) || !lazy(cmds[1]) || lazy(cmds[len(cmds)-1]) {
		t.Fatalf("commands %q: want lazy before the first data job, eager after it", cmds)
	}
	_, e2 := setup(t, containerpool.Config{Pool: 1, Reuse: containerpool.ReuseNone})
	eventually(t, "a container without preload", func() bool { e2.mu.Lock(); defer e2.mu.Unlock(); return len(e2.commands) > 0 })
	e2.mu.Lock()
	defer e2.mu.Unlock()
	if cmd := e2.commands[0]; lazy(cmd) || slices.ContainsFunc(cmd, func(a string) bool { return strings.HasPrefix(a, "--preload") }) {
		t.Fatalf("without preload modules: %q", cmd)
	}
}

func TestWarmPoolRefills(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{Pool: 2, Reuse: containerpool.ReuseNone})
	eventually(t, "2 warm", func() bool { return p.Warm() == 2 })
	a, b := run(t, p, "", "x"), run(t, p, "", "x")
	if a == b {
		t.Fatalf("two jobs without reuse in one container %s", a)
	}
	eventually(t, "the pool refills and the used containers go", func() bool { return p.Warm() == 2 && e.liveN() == 2 })
	if st := p.Stats(); st.Started != 4 || st.StartFailures != 0 || st.Warm != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReuseWithinNamespace(t *testing.T) {
	t.Parallel()
	p, _ := setup(t, containerpool.Config{MaxUses: 3})
	a1, a2 := run(t, p, "a", "x"), run(t, p, "a", "x")
	if a1 != a2 || p.Idle() != 1 {
		t.Fatalf("namespace a ran in %s then %s, %d idle", a1, a2, p.Idle())
	}
	if b := run(t, p, "b", "x"); b == a1 {
		t.Fatalf("namespace b ran in a's container %s", b)
	}
	if p.Idle() != 2 {
		t.Fatalf("%d idle, want a's and b's", p.Idle())
	}
	// The third job retires the container (MaxUses 3).
	if a3 := run(t, p, "a", "x"); a3 != a1 {
		t.Fatalf("third job of a in %s, not %s", a3, a1)
	}
	if a4 := run(t, p, "a", "x"); a4 == a1 {
		t.Fatalf("a container past MaxUses served again")
	}
	// A runner that says it is done for (last) is not kept.
	if run(t, p, "c", "last"); p.Idle() != 2 {
		t.Fatalf("%d idle after a runner's last job, want 2", p.Idle())
	}
	// A job with its own memory never takes an idle container nor leaves one.
	res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: "a", Code: "x", Memory: 1 << 30, Timeout: 5 * time.Second}, nil)
	if err != nil || res.Stdout == a1 || p.Idle() != 2 {
		t.Fatalf("sized job: %v %+v, %d idle", err, res, p.Idle())
	}
}

// TestIdleForLanguage: a job takes its namespace's idle container armed for
// its language; a namespace whose only idle container is not armed takes a
// warm one too (back-to-back calls then alternate between two); with none
// armed, the one that has re-armed longest, but for JavaScript a third,
// warm, one first.
func TestIdleForLanguage(t *testing.T) {
	t.Parallel()
	p, _ := setup(t, containerpool.Config{Pool: 1})
	runLang := func(lang, code string) string {
		t.Helper()
		res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: "a", Language: lang, Code: code, Timeout: 5 * time.Second}, nil)
		if err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("run %s %q: %v %+v", lang, code, err, res)
		}
		return res.Stdout
	}
	eventually(t, "1 warm", func() bool { return p.Warm() == 1 })
	py := runLang(sandbox.Python, "ready:python")
	eventually(t, "the warm pool refilled", func() bool { return p.Warm() == 1 })
	// Python's container is armed, but not for JavaScript: a warm one joins.
	js := runLang(sandbox.JavaScript, "ready:python,javascript")
	if js == py || p.Idle() != 2 {
		t.Fatalf("javascript ran in %s (python's is %s), %d idle", js, py, p.Idle())
	}
	// Each language to the container armed for it, the most recent notwithstanding.
	if got := runLang(sandbox.Python, "ready:python"); got != py {
		t.Fatalf("python ran in %s, not in %s (armed for python alone)", got, py)
	}
	if got := runLang(sandbox.JavaScript, "x"); got != js {
		t.Fatalf("javascript ran in %s, not in %s (armed for it)", got, js)
	}
	// py is armed, js is not: python goes to py; then neither is armed, and
	// the next job takes the one idle longest (js).
	if got := runLang(sandbox.Python, "x"); got != py {
		t.Fatalf("python ran in %s, not in the armed %s", got, py)
	}
	if got := runLang(sandbox.Python, "x"); got != js {
		t.Fatalf("with none armed, python ran in %s, not in %s (idle longest)", got, js)
	}
	if p.Idle() != 2 {
		t.Fatalf("%d idle, want the namespace's two", p.Idle())
	}
	// Neither is armed: JavaScript (whose re-arm is Node's start) takes a
	// third, warm, box rather than wait for one; Python would not.
	eventually(t, "the warm pool refilled", func() bool { return p.Warm() == 1 })
	if got := runLang(sandbox.JavaScript, "x"); got == py || got == js {
		t.Fatalf("with none armed, javascript waited for %s rather than take a warm box", got)
	}
	if p.Idle() != 3 {
		t.Fatalf("%d idle, want the namespace's three", p.Idle())
	}
}

// TestTenantTakesNoWarmBoxPastItsBound: a namespace whose boxes, idle and
// running its jobs, reach MaxIdlePerTenant waits for its idle box rather
// than take a warm one. Taken, the warm box would be one too many once the
// namespace's calls paused: putIdle would discard a box, and the next warm
// one taken would cost a container start, again and again.
func TestTenantTakesNoWarmBoxPastItsBound(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{Pool: 1, MaxIdlePerTenant: 2})
	eventually(t, "1 warm", func() bool { return p.Warm() == 1 })
	first := run(t, p, "a", "x") // a warm box, left idle and not armed
	eventually(t, "the warm pool refilled", func() bool { return p.Warm() == 1 })
	release := make(chan struct{})
	holds.Store(t.Name(), release)
	held := make(chan string, 1)
	go func() {
		res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: "a", Code: "hold:" + t.Name(), Timeout: 5 * time.Second}, nil)
		if err != nil {
			t.Error(err)
		}
		held <- res.Stdout
	}()
	// The held job took a warm box (one idle, none running): two in all.
	eventually(t, "the held job took the warm box, and the pool refilled", func() bool { return p.Warm() == 1 && p.Idle() == 1 && e.createdN() == 3 })
	if got := run(t, p, "a", "x"); got != first {
		t.Fatalf("with one box running and one idle (bound 2), the job ran in %s, not in the idle %s", got, first)
	}
	close(release)
	if got := <-held; got == first {
		t.Fatalf("the held job ran in %s too", got)
	}
	p.WaitRemovals()
	e.mu.Lock()
	removed := slices.Clone(e.removed)
	e.mu.Unlock()
	if len(removed) != 0 || p.Idle() != 2 {
		t.Fatalf("%d idle, containers removed %v: want the namespace's two kept", p.Idle(), removed)
	}
}

func TestIdleBounds(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{MaxIdle: 3, MaxIdlePerTenant: 2})
	// Jobs of one namespace at once: each needs a container of its own.
	hold := func(tenant string, n int) []string {
		var mu sync.Mutex
		var ids []string
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: tenant, Code: "x", Timeout: 5 * time.Second}, nil)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				ids = append(ids, res.Stdout)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return ids
	}
	hold("a", 3)
	if p.Idle() > 2 {
		t.Fatalf("%d idle for one namespace, bound 2", p.Idle())
	}
	run(t, p, "b", "x")
	run(t, p, "c", "x")
	p.WaitRemovals()
	if p.Idle() != 3 {
		t.Fatalf("%d idle, bound 3", p.Idle())
	}
	// The least recently used made room: what is live is what is idle.
	if e.liveN() != 3 {
		t.Fatalf("%d containers live, want the 3 idle", e.liveN())
	}
}

func TestLostRunnerNotKept(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{})
	res, err := p.Run(context.Background(), sandbox.Job{ID: "j", Tenant: "a", Code: "lose", Timeout: 5 * time.Second}, nil)
	if err != nil || !strings.HasPrefix(res.Error, "lost c1") {
		t.Fatalf("lost runner: %v %+v", err, res)
	}
	p.WaitRemovals()
	if p.Idle() != 0 || e.liveN() != 0 {
		t.Fatalf("%d idle, %d live after a lost runner", p.Idle(), e.liveN())
	}
}

func TestSessions(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{})
	ctx := context.Background()
	job := sandbox.Job{ID: "j", Code: "x", Timeout: 5 * time.Second}
	r1, err1 := p.RunInSession(ctx, "s", job, nil)
	r2, err2 := p.RunInSession(ctx, "s", job, nil)
	if err1 != nil || err2 != nil || r1.Stdout != r2.Stdout || !p.HasSession("s") {
		t.Fatalf("session jobs: %v %v in %s and %s", err1, err2, r1.Stdout, r2.Stdout)
	}
	if err := p.EndSession("s"); err != nil {
		t.Fatal(err)
	}
	p.WaitRemovals()
	if p.HasSession("s") || e.liveN() != 0 {
		t.Fatalf("after EndSession: session %v, %d live", p.HasSession("s"), e.liveN())
	}
}

func TestStartFailure(t *testing.T) {
	t.Parallel()
	p, e := setup(t, containerpool.Config{})
	e.mu.Lock()
	e.failCreate = true
	e.mu.Unlock()
	_, err := p.Run(context.Background(), sandbox.Job{ID: "j", Code: "x", Timeout: 5 * time.Second}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "fake sandbox: start container: no") {
		t.Fatalf("Run with a failing engine: %v", err)
	}
	if st := p.Stats(); st.StartFailures != 1 || e.liveN() != 0 {
		t.Fatalf("stats %+v, %d live: want the failed container removed", st, e.liveN())
	}
}

func TestOrphansAndClose(t *testing.T) {
	t.Parallel()
	// No pool: RemoveOrphans runs before Start in a runtime's New, and would
	// take a warm container of this worker for an orphan.
	p, e := setup(t, containerpool.Config{})
	mine := map[string]string{containerpool.LabelManaged: "true", containerpool.LabelWorker: "w"}
	other := map[string]string{containerpool.LabelManaged: "true", containerpool.LabelWorker: "v", containerpool.LabelOwner: sandbox.OwnerLabel}
	gone := map[string]string{containerpool.LabelManaged: "true", containerpool.LabelWorker: "v", containerpool.LabelOwner: sandbox.HostName + "/999999999/1"}
	e.add("mine", mine)
	e.add("other", other)
	e.add("gone", gone)
	if err := p.RemoveOrphans(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	removed := slices.Clone(e.removed)
	e.mu.Unlock()
	if !slices.Contains(removed, "mine") || !slices.Contains(removed, "gone") || slices.Contains(removed, "other") {
		t.Fatalf("removed %v: want this worker's and the gone owner's", removed)
	}
	run(t, p, "a", "x")
	p.Close()
	p.Close() // idempotent
	if err := p.RemoveLeftovers(); err != nil {
		t.Fatal(err)
	}
	if e.liveN() != 1 { // "other" only
		t.Fatalf("%d containers live after Close", e.liveN())
	}
	if _, err := p.Run(context.Background(), sandbox.Job{ID: "j", Code: "x"}, nil); !errors.Is(err, containerpool.ErrClosed) || err.Error() != "fake sandbox: runtime is closed" {
		t.Fatalf("Run after Close: %v", err)
	}
	if _, err := p.RunInSession(context.Background(), "s", sandbox.Job{ID: "j", Code: "x"}, nil); !errors.Is(err, containerpool.ErrClosed) {
		t.Fatalf("RunInSession after Close: %v", err)
	}
}

func TestCloseBeforeStart(t *testing.T) {
	t.Parallel()
	cfg := containerpool.Config{RunDir: filepath.Join(t.TempDir(), "run"), Pool: 2}
	if err := cfg.SetDefaults("fake sandbox"); err != nil {
		t.Fatal(err)
	}
	p, err := containerpool.New("fake sandbox", cfg, &fakeEngine{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Start() // after Close: starts nothing
	if p.Warm() != 0 {
		t.Fatal("a closed pool filled")
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := containerpool.Config{Pool: -1}
	if err := c.SetDefaults("x sandbox"); err != nil {
		t.Fatal(err)
	}
	if c.Pool != 0 || c.Reuse != containerpool.ReuseNamespace || c.MaxUses != containerpool.DefaultMaxUses || c.MaxIdle < 8 || c.MaxIdle > 32 || c.MaxIdlePerTenant != 4 ||
		c.IdleTTL != 2*time.Minute || c.Limits.User != "65534:65534" || c.WorkerID == "" || c.RunDir == "" || c.Image != containerpool.DefaultImage {
		t.Fatalf("defaults %+v", c)
	}
	c = containerpool.Config{Reuse: "always"}
	if err := c.SetDefaults("x sandbox"); err == nil || err.Error() != `x sandbox: reuse mode "always": want "namespace" or "none"` {
		t.Fatalf("reuse always: %v", err)
	}
}
