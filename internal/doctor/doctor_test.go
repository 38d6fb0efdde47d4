package doctor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/docker"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func ptr(s string) *string { return &s }

func enforced() probe {
	return probe{
		Memory: ptr("536870912"), MemSw: ptr("536870912"), Pids: ptr("128"), CPUQuota: ptr("100000"), CPUPeriod: ptr("100000"),
		UID: 65534, GID: 65534, CapEff: "0000000000000000", CapBnd: "0000000000000000",
		NoNewPrivs: "1", Seccomp: "2", NoFile: 1024, NProc: 1024, Ifaces: []string{"lo"},
		Rootfs: "read-only", Tmp: ptr("rw,nosuid,nodev,noexec"), Workspace: ptr("rw,nosuid,nodev,noexec"),
		Env: []string{"HOME", "PATH"},
	}
}

func statusOf(checks []Check, name string) Status {
	for _, c := range checks {
		if c.Name == name {
			return c.Status
		}
	}
	return ""
}

func TestLimitChecks(t *testing.T) {
	l := sandbox.DefaultLimits()
	if got := limitChecks(l, enforced()); len(got) == 0 {
		t.Fatal("no checks")
	} else {
		for _, c := range got {
			if c.Status != OK {
				t.Errorf("%s: %s %s", c.Name, c.Status, c.Detail)
			}
		}
	}
	tests := []struct {
		name  string
		check string
		edit  func(p *probe)
	}{
		{"memory not enforced (rootless on cgroups v1)", "memory limit", func(p *probe) { p.Memory = ptr("9223372036854771712") }},
		{"memory unreadable", "memory limit", func(p *probe) { p.Memory = nil }},
		{"swap allowed", "swap limit", func(p *probe) { p.MemSw = ptr("1073741824") }},
		{"pids not enforced", "pids limit", func(p *probe) { p.Pids = ptr("max") }},
		{"cpu not enforced", "cpu limit", func(p *probe) { p.CPUQuota = ptr("-1") }},
		{"root user", "user", func(p *probe) { p.UID, p.GID = 0, 0 }},
		{"capabilities kept", "capabilities", func(p *probe) { p.CapBnd = "00000000a80425fb" }},
		{"no seccomp", "seccomp", func(p *probe) { p.Seccomp = "0" }},
		{"network", "network", func(p *probe) { p.Ifaces = []string{"lo", "eth0"} }},
		{"writable root", "read-only root", func(p *probe) { p.Rootfs = "writable" }},
		{"exec tmp", "tmpfs /tmp", func(p *probe) { p.Tmp = ptr("rw,nosuid,nodev") }},
		{"env leak", "environment", func(p *probe) { p.Env = append(p.Env, "NATS_PASSWORD") }},
		{"nofile", "rlimit nofile", func(p *probe) { p.NoFile = 1 << 20 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := enforced()
			tt.edit(&p)
			got := limitChecks(l, p)
			if st := statusOf(got, tt.check); st != Fail {
				t.Fatalf("check %q: %s, want FAIL", tt.check, st)
			}
			for _, c := range got {
				if c.Status == Fail && c.Fix == "" {
					t.Errorf("%s fails without a fix", c.Name)
				}
			}
		})
	}
}

func TestReport(t *testing.T) {
	var b bytes.Buffer
	err := Report(&b, "t", []Check{{Name: "a", Status: OK}, {Name: "b", Status: Fail, Detail: "broken", Fix: "mend it"}})
	if !errors.Is(err, ErrFailed) || !strings.Contains(b.String(), "fix: mend it") || !strings.Contains(b.String(), "1 of 2 checks failed") {
		t.Fatalf("err %v report:\n%s", err, b.String())
	}
	b.Reset()
	if err := Report(&b, "t", []Check{{Name: "a", Status: OK}, {Name: "w", Status: Warn, Fix: "x"}}); err != nil {
		t.Fatalf("warnings alone failed the report: %v", err)
	}
}

func TestNATSChecks(t *testing.T) {
	ctx := context.Background()
	qcfg := queue.DefaultConfig()
	b := testutil.Broker(t, "", qcfg)
	checks := Run(ctx, Config{NATSURL: b.ClientURL(), Queue: qcfg})
	for _, c := range checks {
		if c.Status == Fail {
			t.Errorf("%s failed against a fresh broker: %s", c.Name, c.Detail)
		}
	}
	// A front-end also needs a worker: none runs here.
	checks = Run(ctx, Config{NATSURL: b.ClientURL(), Queue: qcfg, ExpectWorkers: true})
	if statusOf(checks, "workers") != Fail || statusOf(checks, "state service") != OK {
		t.Fatalf("checks %+v", checks)
	}
	if c := checkNamed(checks, "sync"); c.Status != OK || !strings.HasPrefix(c.Detail, "always, group sync barriers (mcpexec)") {
		t.Fatalf("sync of a default broker: %+v", c)
	}
	for _, name := range []string{"approvals bucket", "stream " + qcfg.Subjects.AuditStream()} {
		if statusOf(checks, name) != OK {
			t.Errorf("%s of a fresh broker: %+v", name, checkNamed(checks, name))
		}
	}
	// A broker that keeps no audit trail (one older than it) is named, with
	// the fix, and jobs still pass.
	js, err := jetstream.New(testutil.Connect(t, b, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, qcfg.Subjects.AuditStream()); err != nil {
		t.Fatal(err)
	}
	checks = Run(ctx, Config{NATSURL: b.ClientURL(), Queue: qcfg})
	if c := checkNamed(checks, "stream "+qcfg.Subjects.AuditStream()); c.Status != Warn || c.Fix == "" || !strings.Contains(c.Detail, "audit entries cannot be kept") {
		t.Fatalf("no audit stream: %+v", c)
	}
	checks = Run(ctx, Config{NATSURL: "nats://127.0.0.1:1", Queue: qcfg})
	if statusOf(checks, "nats") != Fail {
		t.Fatalf("unreachable NATS: %+v", checks)
	}
}

func checkNamed(checks []Check, name string) Check {
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}

// TestSyncChecks: a broker that acknowledges before it fsyncs is named in a
// warning with the fix, in a fleet (from its state replica's $SRV.INFO) and
// in the embedded mode (from --sync).
func TestSyncChecks(t *testing.T) {
	ctx := context.Background()
	qcfg := queue.DefaultConfig()
	b, err := broker.Start(ctx, broker.Config{Logger: testutil.Logger(t), DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Queue: qcfg, ServerName: "sync-node", Sync: broker.SyncPolicy{Interval: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	c := checkNamed(Run(ctx, Config{NATSURL: b.ClientURL(), Queue: qcfg, ExpectWorkers: true}), "sync")
	if c.Status != Warn || !strings.Contains(c.Detail, "interval:2m0s (sync-node)") || !strings.Contains(c.Fix, "--sync always") {
		t.Fatalf("sync of a broker with an interval: %+v", c)
	}
	checks := Run(ctx, Config{SkipNATSReason: "embedded", EmbeddedSync: "interval:1s"})
	if c := checkNamed(checks, "sync"); c.Status != Warn || !strings.Contains(c.Detail, "interval:1s (the embedded broker)") || c.Fix == "" {
		t.Fatalf("embedded sync interval: %+v", c)
	}
	checks = Run(ctx, Config{SkipNATSReason: "embedded", EmbeddedSync: "always"})
	if c := checkNamed(checks, "sync"); c.Status != OK || !strings.Contains(c.Detail, "always, group sync barriers (the embedded broker)") {
		t.Fatalf("embedded sync always: %+v", c)
	}
	// Several brokers: each policy with its nodes.
	c = syncCheck(map[string][]string{"always": {"n2", "n1"}, "interval:1s": {"n3"}}, "fix it")
	if c.Status != Warn || !strings.HasPrefix(c.Detail, "always (n1, n2); interval:1s (n3)") {
		t.Fatalf("mixed fleet: %+v", c)
	}
}

// testEngines open each container engine's runtime as the worker does, on
// the engine the test environment names.
var testEngines = []struct {
	name string
	// open returns the engine's opener, or skips t where it is not installed.
	open     func(t *testing.T) func(ctx context.Context, cfg containerpool.Config) (Runtime, error)
	skip     func(tb testing.TB, format string, args ...any)
	required []string // checks that must pass where the engine enforces limits
}{
	{
		name: containerpool.Podman,
		open: func(t *testing.T) func(ctx context.Context, cfg containerpool.Config) (Runtime, error) {
			if _, err := exec.LookPath("podman"); err != nil {
				testutil.SkipOrFail(t, "podman is not installed (make deps)")
			}
			return func(ctx context.Context, cfg containerpool.Config) (Runtime, error) {
				return podman.New(ctx, podman.Config{Config: cfg, URI: os.Getenv("MCPEXEC_PODMAN")})
			}
		},
		skip:     testutil.SkipOrFail,
		required: []string{"memory limit", "pids limit", "user", "network", "read-only root", "rlimit nofile", "libraries"},
	},
	{
		name: containerpool.Docker,
		open: func(*testing.T) func(ctx context.Context, cfg containerpool.Config) (Runtime, error) {
			return func(ctx context.Context, cfg containerpool.Config) (Runtime, error) {
				return docker.New(ctx, docker.Config{Config: cfg, Host: testutil.DockerHost()})
			}
		},
		skip: testutil.SkipOrFailDocker,
		required: []string{"memory limit", "swap limit", "pids limit", "cpu limit", "user", "capabilities", "no_new_privs", "seccomp",
			"network", "read-only root", "tmpfs /tmp", "tmpfs /workspace", "rlimit nofile", "rlimit nproc", "environment", "languages", "libraries"},
	},
}

// TestSandboxChecks: on each engine, a working host passes the sandbox
// checks, one that does not enforce limits fails them, and a missing image
// is reported.
func TestSandboxChecks(t *testing.T) {
	for _, e := range testEngines {
		t.Run(e.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			box := &Sandbox{Engine: e.name, Open: e.open(t),
				Config: containerpool.Config{Image: os.Getenv("MCPEXEC_IMAGE"), Logger: testutil.Logger(t)}}
			checks := Run(ctx, Config{Sandbox: box, RuntimeReason: "--runtime " + e.name})
			var b bytes.Buffer
			err := Report(&b, "doctor", checks)
			t.Log(b.String())
			if statusOf(checks, e.name+" api") == Fail {
				e.skip(t, "%s unavailable: %s", e.name, b.String())
			}
			if statusOf(checks, "runtime") != OK || !strings.Contains(b.String(), e.name+" (--runtime "+e.name+")") {
				t.Fatalf("the chosen runtime is not reported")
			}
			if statusOf(checks, e.name+" mode") == Fail {
				// A host where limits are not enforced must say so, and fail.
				if err == nil || statusOf(checks, "memory limit") != Fail && statusOf(checks, "swap limit") != Fail && statusOf(checks, "pids limit") != Fail {
					t.Fatalf("limits not enforced but the report passed")
				}
				return
			}
			if err != nil {
				t.Fatalf("doctor failed on a working host: %v", err)
			}
			for _, name := range e.required {
				if statusOf(checks, name) != OK {
					t.Errorf("%s: %s", name, statusOf(checks, name))
				}
			}

			box.Config.Image = "localhost/mcpexec-no-such-image:doctor"
			checks = Run(ctx, Config{Sandbox: box})
			if statusOf(checks, "sandbox image") != Fail {
				t.Fatalf("missing image not reported: %+v", checks)
			}
		})
	}
}

// TestNodeCheck: a Node.js built without its startup snapshot (Debian's,
// which build.sh falls back to without npm) is a warning with its fix; the
// official build is OK. The probe's output is what the engines' runs of
// nodeProbe print (TestSandboxChecks runs it on the image).
func TestNodeCheck(t *testing.T) {
	for _, c := range []struct {
		out    string
		status Status
		detail string
	}{
		{"v22.23.5 snapshot\n", OK, "python, javascript (Node.js v22.23.5)"},
		{"v18.20.4 no-snapshot\n", Warn, "python, javascript (Node.js v18.20.4, built without its startup snapshot"},
	} {
		got := nodeCheck(c.out, "img")
		if got.Name != "languages" || got.Status != c.status || !strings.HasPrefix(got.Detail, c.detail) {
			t.Errorf("%q: %+v", c.out, got)
		}
		if c.status == Warn && !strings.Contains(got.Fix, "build.sh --force img") {
			t.Errorf("%q: fix %q", c.out, got.Fix)
		}
	}
}
