package podman

// This file finds or starts the Podman API service.
import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// connect finds (or starts) the Podman service and reads its description.
func (r *Runtime) connect(ctx context.Context, info *Info) error {
	var uris []string
	switch {
	case r.cfg.URI != "":
		uris = []string{r.cfg.URI}
	case r.cfg.StorageRoot != "":
		// Its own storage: only a service of its own has it.
	default:
		if os.Geteuid() != 0 {
			if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
				uris = append(uris, "unix://"+filepath.Join(d, "podman", "podman.sock"))
			}
		} else {
			uris = append(uris, "unix:///run/podman/podman.sock")
		}
	}
	var errs []error
	for _, u := range uris {
		if strings.HasPrefix(u, "unix://") {
			if _, err := os.Stat(strings.TrimPrefix(u, "unix://")); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", u, err))
				continue
			}
		}
		c, err := dial(ctx, u)
		if err == nil {
			r.conn, info.Address = c, u
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	if r.conn == nil {
		if r.cfg.URI != "" {
			return fmt.Errorf("podman sandbox: cannot reach the Podman API at %s (start it with `podman system service --time=0 %s`, or leave the URI empty to let mcpexec start one): %w", r.cfg.URI, r.cfg.URI, errors.Join(errs...))
		}
		if err := r.startService(ctx, info); err != nil {
			return fmt.Errorf("podman sandbox: no Podman API socket answered (%w) and starting one failed: %w", errors.Join(errs...), err)
		}
	}

	c, cancel := r.callCtx(ctx, serviceTimeout)
	defer cancel()
	pi, err := system.Info(c, nil)
	if err != nil {
		return fmt.Errorf("podman sandbox: podman info: %w", err)
	}
	info.Engine = containerpool.Podman
	info.Image = r.cfg.Image
	if r.cfg.Rootfs != "" {
		info.Image = "rootfs:" + r.cfg.Rootfs
	}
	info.OCIRuntime = r.cfg.OCIRuntime
	info.Rootless = pi.Host.Security.Rootless
	info.CgroupsVersion = pi.Host.CgroupsVersion
	info.ServerVersion = pi.Version.Version
	info.LimitsEnforced = !(pi.Host.Security.Rootless && pi.Host.CgroupsVersion == "v1")
	if !info.LimitsEnforced {
		r.log.Warn("podman sandbox: rootless Podman on cgroups v1 does not enforce memory, pids or CPU limits; "+
			"a job can exhaust the host's memory. Use rootful Podman (e.g. --podman unix:///run/podman/podman.sock as root) or a cgroups v2 host",
			"uri", info.Address, "cgroups", pi.Host.CgroupsVersion)
	}
	return nil
}

// dial opens a bindings connection to uri, bounded by serviceTimeout.
func dial(ctx context.Context, uri string) (context.Context, error) {
	type res struct {
		c   context.Context
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := bindings.NewConnection(context.Background(), uri)
		ch <- res{c, err}
	}()
	select {
	case x := <-ch:
		return x.c, x.err
	case <-time.After(serviceTimeout):
		return nil, errors.New("no answer within " + serviceTimeout.String())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startService starts `podman system service` on a private socket, connects,
// and supervises it: when it dies, it is started again (with backoff) on the
// same socket, where the bindings connection finds it.
func (r *Runtime) startService(ctx context.Context, info *Info) error {
	podman, err := exec.LookPath("podman")
	if err != nil {
		return errors.New("podman is not installed (apt-get install podman runc uidmap)")
	}
	dir, err := os.MkdirTemp("", "mcpexec-podman-")
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "podman.sock")
	uri := "unix://" + sock
	// No events: nothing here reads them, and each container would write six
	// (`podman events` does not show this service's containers).
	args := []string{"--events-backend", "none"}
	if r.cfg.StorageRoot != "" {
		args = append(args, StorageFlags(r.cfg.StorageRoot)...)
	}
	if !r.cfg.KeepExitCommand {
		if w, err := conmonWrapper(dir); err != nil {
			r.log.Debug("podman sandbox: keeping conmon's exit command", "reason", err)
		} else {
			args = append(args, "--conmon", w)
		}
	}
	args = append(args, "system", "service", "--time=0", uri)
	svc := &service{path: podman, args: args, dir: dir, sock: sock, uri: uri, log: r.log, stop: make(chan struct{}), supervised: make(chan struct{})}
	svc.quit, svc.quitNow = context.WithCancel(context.Background())
	svc.hungAfter = cmp.Or(r.cfg.ServiceHungAfter, DefaultServiceHungAfter)
	svc.probe = r.probe
	r.svc = svc
	if err := svc.launch(); err != nil {
		return err
	}
	if err := svc.waitReady(ctx); err != nil {
		return err
	}
	c, err := bindings.NewConnection(context.Background(), uri)
	if err != nil {
		return fmt.Errorf("connect to the podman service: %w", err)
	}
	r.conn, info.Address, info.StartedService = c, uri, true
	r.log.Info("podman sandbox: started podman system service", "uri", uri, "pid", svc.pid())
	svc.supervising.Store(true)
	go svc.supervise()
	return nil
}

// service is a `podman system service` a Runtime started and keeps running.
type service struct {
	path        string
	args        []string
	dir, sock   string
	uri         string
	log         *slog.Logger
	stop        chan struct{} // closed by shutdown
	supervised  chan struct{} // closed when supervise returns
	supervising atomic.Bool   // supervise was started

	// probe asks the service something that waits for its containers' locks;
	// every probe unanswered for hungAfter gets the service killed (and so
	// started again).
	probe     func(context.Context) error
	hungAfter time.Duration
	quit      context.Context // ends at shutdown: a probe under way gives up
	quitNow   context.CancelFunc

	mu       sync.Mutex // guards cmd, done, stderr, restarts
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd exits
	stderr   *tailBuffer
	restarts int
}

// launch starts the service process.
func (s *service) launch() error {
	_ = os.Remove(s.sock) // a dead service's socket
	cmd := exec.Command(s.path, s.args...)
	// conmon (Podman 4.3, cgroups v1) drops an empty "oom" file in its working
	// directory when a container is OOM-killed: keep that out of the caller's.
	cmd.Dir = s.dir
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	// Own process group: a Ctrl-C meant for the worker must not kill the service
	// before the worker has removed its containers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start podman system service: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // its exit is observed through done
	s.mu.Lock()
	s.cmd, s.done, s.stderr = cmd, done, stderr
	s.mu.Unlock()
	return nil
}

// waitReady waits until the service answers on its socket.
func (s *service) waitReady(ctx context.Context) error {
	s.mu.Lock()
	done, stderr := s.done, s.stderr
	s.mu.Unlock()
	deadline := time.Now().Add(serviceTimeout)
	for {
		if c, err := net.DialTimeout("unix", s.sock, time.Second); err == nil {
			_ = c.Close() // the dial was the probe: the socket answers
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("podman system service exited: %s", strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errors.New("podman sandbox: runtime is closing")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("podman system service did not answer on %s within %s", s.uri, serviceTimeout)
		}
	}
}

// supervise starts the service again whenever it dies, and kills it when it
// stops answering (so that it is started again), until shutdown.
func (s *service) supervise() {
	defer close(s.supervised)
	delay := time.Second
	for {
		s.mu.Lock()
		done, stderr := s.done, s.stderr
		s.mu.Unlock()
		if !s.watch(done) {
			return
		}
		s.log.Error("podman sandbox: the podman service died: starting it again", "in", delay, "stderr", strings.TrimSpace(stderr.String()))
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(delay):
			}
			err := s.launch()
			if err == nil {
				err = s.waitReady(context.Background())
			}
			if err == nil {
				s.mu.Lock()
				s.restarts++
				s.mu.Unlock()
				s.log.Info("podman sandbox: podman service running again", "pid", s.pid())
				delay = time.Second
				break
			}
			s.log.Error("podman sandbox: restart the podman service", "err", err)
			delay = min(2*delay, 30*time.Second)
		}
	}
}

// watch probes the service until it exits (true) or shutdown (false). When
// no probe has been answered for hungAfter, it kills the service: a Podman
// service whose locks are wedged answers nothing again, and every job of the
// worker would wait on it.
func (s *service) watch(done <-chan struct{}) bool {
	every := min(s.hungAfter/4, 15*time.Second)
	answered := time.Now()
	for {
		select {
		case <-s.stop:
			return false
		case <-done:
			return true
		case <-time.After(every):
		}
		ctx, cancel := context.WithTimeout(s.quit, every)
		err := s.probe(ctx)
		timedOut := ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)
		cancel()
		if s.quit.Err() != nil {
			return false // shutdown ended the probe
		}
		if !timedOut {
			// An answer, even an error: a service that says what is wrong
			// is not wedged.
			answered = time.Now()
			continue
		}
		if silent := time.Since(answered); silent >= s.hungAfter {
			s.mu.Lock()
			cmd := s.cmd
			s.mu.Unlock()
			s.log.Error("podman sandbox: the podman service has not answered: killing it to start it again",
				"for", silent.Round(time.Second), "pid", cmd.Process.Pid, "err", err)
			_ = cmd.Process.Kill() // it may have exited meanwhile: done says so either way
			select {
			case <-s.stop:
				return false
			case <-done:
				return true
			}
		}
	}
}

func (s *service) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// shutdown stops supervising and ends the service.
func (s *service) shutdown() {
	if s.quitNow != nil {
		s.quitNow()
	}
	close(s.stop)
	if s.supervising.Load() {
		<-s.supervised
	}
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM) // it may have exited already
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill() // it may have exited already
			<-done
		}
	}
	_ = os.RemoveAll(s.dir) // best effort: what is left is removed at the next start
}

// conmonWrapperScript runs conmon without its exit command (see
// Config.KeepExitCommand); %s is conmon's path.
const conmonWrapperScript = `#!/bin/sh
# conmon for mcpexec's Podman service, without --exit-command: the worker removes
# each container itself, so the podman cleanup process at each exit is redundant.
skip=0
for a do
	shift
	if [ "$skip" = 1 ]; then skip=0; continue; fi
	case "$a" in
	--exit-command | --exit-command-arg) skip=1; continue ;;
	--exit-command=* | --exit-command-arg=*) continue ;;
	esac
	set -- "$@" "$a"
done
exec %s "$@"
`

// conmonWrapper writes the wrapper of the host's conmon into dir and checks
// that it runs.
func conmonWrapper(dir string) (string, error) {
	conmon, err := findConmon()
	if err != nil {
		return "", err
	}
	return writeConmonWrapper(dir, conmon)
}

// findConmon returns the path of conmon.
func findConmon() (string, error) {
	conmon := ""
	// Podman's own search order (containers.conf conmon_path), then PATH.
	for _, p := range []string{"/usr/libexec/podman/conmon", "/usr/local/libexec/podman/conmon", "/usr/local/lib/podman/conmon", "/usr/bin/conmon", "/usr/sbin/conmon", "/usr/local/bin/conmon", "/usr/local/sbin/conmon"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			conmon = p
			break
		}
	}
	if conmon == "" {
		p, err := exec.LookPath("conmon")
		if err != nil {
			return "", errors.New("conmon not found")
		}
		conmon = p
	}
	return conmon, nil
}

// writeConmonWrapper writes a wrapper of conmon into dir and checks that it
// runs (`WRAPPER --version`).
func writeConmonWrapper(dir, conmon string) (string, error) {
	if strings.ContainsAny(conmon, "'\"\\$`\n ") {
		return "", fmt.Errorf("conmon path %q needs quoting", conmon)
	}
	w := filepath.Join(dir, "conmon")
	if err := os.WriteFile(w, fmt.Appendf(nil, conmonWrapperScript, conmon), 0o755); err != nil {
		return "", err
	}
	// A noexec temp dir, or no /bin/sh: keep the real conmon.
	if out, err := exec.Command(w, "--version").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", w, err, strings.TrimSpace(string(out)))
	}
	return w, nil
}

// checkImage checks that the image (or --rootfs) is there and learns which
// languages its sandboxes run.
func (r *Runtime) checkImage(ctx context.Context) ([]string, error) {
	langs := []string{sandbox.Python}
	if r.cfg.Rootfs != "" {
		if _, err := os.Stat(filepath.Join(r.cfg.Rootfs, "usr", "bin", "python3")); err != nil {
			return nil, fmt.Errorf("podman sandbox: --rootfs %s has no usr/bin/python3 (%w): give a directory holding a root file system with Python 3, e.g. an exported sandbox image", r.cfg.Rootfs, err)
		}
		// Where the sandbox's PATH finds node: the image's official build
		// (usr/local/bin), or a distribution's package.
		for _, bin := range []string{"usr/local/bin", "usr/bin"} {
			if _, err := os.Stat(filepath.Join(r.cfg.Rootfs, bin, "node")); err == nil {
				langs = append(langs, sandbox.JavaScript)
				break
			}
		}
		return langs, nil
	}
	c, cancel := r.callCtx(ctx, 30*time.Second)
	defer cancel()
	ok, err := images.Exists(c, r.cfg.Image, nil)
	if err != nil {
		return nil, fmt.Errorf("podman sandbox: check image %s: %w", r.cfg.Image, err)
	}
	if !ok {
		return nil, fmt.Errorf("podman sandbox: image %s %w: build it with `sudo deploy/sandbox/build.sh %s` (or `make image`)", r.cfg.Image, sandbox.ErrNoImage, r.cfg.Image)
	}
	rep, err := images.GetImage(c, r.cfg.Image, nil)
	if err != nil {
		return nil, fmt.Errorf("podman sandbox: inspect image %s: %w", r.cfg.Image, err)
	}
	if rep.ImageData != nil {
		langs = sandbox.AddLabelledLanguages(langs, rep.Labels[sandbox.LanguagesLabel])
	}
	return langs, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// StorageFlags are the podman flags of a storage of its own under root
// (Config.StorageRoot): its images and containers, its run state and its
// libpod tmpdir (the host's is shared by every storage otherwise).
func StorageFlags(root string) []string {
	return []string{"--root", root, "--runroot", filepath.Join(root, "run"), "--tmpdir", filepath.Join(root, "tmp")}
}
