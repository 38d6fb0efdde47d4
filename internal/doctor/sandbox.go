package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// probe is what probeCode prints.
type probe struct {
	Memory     *string  `json:"memory"`
	MemSw      *string  `json:"memsw"`
	Pids       *string  `json:"pids"`
	CPUQuota   *string  `json:"cpu_quota"`
	CPUPeriod  *string  `json:"cpu_period"`
	CPUMax     *string  `json:"cpu_max"`
	UID        int      `json:"uid"`
	GID        int      `json:"gid"`
	CapEff     string   `json:"cap_eff"`
	CapBnd     string   `json:"cap_bnd"`
	NoNewPrivs string   `json:"no_new_privs"`
	Seccomp    string   `json:"seccomp"`
	NoFile     int64    `json:"nofile"`
	NProc      int64    `json:"nproc"`
	Ifaces     []string `json:"ifaces"`
	Rootfs     string   `json:"rootfs"`
	Tmp        *string  `json:"tmp"`
	Workspace  *string  `json:"workspace"`
	Env        []string `json:"env"`
}

// Sandbox is a container runtime to check.
type Sandbox struct {
	// Engine names the engine (containerpool.Podman, containerpool.Docker).
	Engine string
	// Address is the engine's API address where the configuration names it,
	// for the report of an engine that answers without the image.
	Address string
	// Config is the runtime's configuration; doctor sets Pool, WorkerID,
	// Limits (when zero) and Image (when empty).
	Config containerpool.Config
	// Open opens the engine's runtime of cfg.
	Open func(ctx context.Context, cfg containerpool.Config) (Runtime, error)
}

// Runtime is a container runtime as doctor checks it.
type Runtime interface {
	sandbox.Runtime
	Info() containerpool.Info
	Close() error
}

// checkSandbox opens s's runtime and checks its engine and a sandbox of it.
func checkSandbox(ctx context.Context, s Sandbox) []Check {
	e := engines[s.Engine]
	api := s.Engine + " api"
	cfg := s.Config
	cfg.Pool = 0
	cfg.WorkerID = probeWorkerID()
	cfg.Limits = limitsOrDefault(cfg.Limits)
	if cfg.Image == "" {
		cfg.Image = containerpool.DefaultImage
	}
	var out []Check
	start := time.Now()
	rt, err := s.Open(ctx, cfg)
	if errors.Is(err, sandbox.ErrNoImage) {
		return append(out, Check{Name: api, Status: OK, Detail: strings.TrimSpace(s.Address + " answered")}, e.noImage(cfg.Image, s.Address))
	}
	if err != nil {
		return append(out, Check{Name: api, Status: Fail, Detail: err.Error(), Fix: e.apiFix})
	}
	defer func() { _ = rt.Close() }() // the checks are done: a failure changes none of them
	info := rt.Info()
	mode := rootMode(info.Rootless)
	detail := info.Address + " (" + e.title + " " + info.ServerVersion
	if info.APIVersion != "" {
		detail += ", API " + info.APIVersion
	}
	detail += ", " + mode + ", cgroups " + info.CgroupsVersion
	if info.CgroupDriver != "" {
		detail += " with " + info.CgroupDriver
	}
	detail += ", OCI runtime " + info.OCIRuntime
	if info.StartedService {
		detail += ", service started by mcpexec"
	}
	out = append(out, Check{Name: api, Status: OK, Detail: detail + ")"})
	switch {
	case !info.LimitsEnforced:
		out = append(out, Check{Name: s.Engine + " mode", Status: Fail, Detail: e.unlimits(info), Fix: e.fixes.limits})
	case !info.Rootless:
		c := e.rootful
		c.Name = s.Engine + " mode"
		out = append(out, c)
	default:
		out = append(out, Check{Name: s.Engine + " mode", Status: OK, Detail: "rootless, limits enforced by cgroups " + info.CgroupsVersion})
	}
	if info.UserNS {
		out = append(out, Check{Name: "user namespaces", Status: OK, Detail: "each sandbox has its own (--userns=auto)"})
	} else {
		c := e.noUserNS(info)
		c.Name = "user namespaces"
		out = append(out, c)
	}
	out = append(out, Check{Name: "sandbox image", Status: OK, Detail: cfg.Image})
	return append(out, probeChecks(ctx, rt, cfg.Limits, cfg.Image, start, e.fixes, e.startFix(info, cfg.Image))...)
}

// probeChecks runs the probe in a sandbox of rt and checks what it reads back.
func probeChecks(ctx context.Context, rt sandbox.Runtime, l sandbox.Limits, image string, start time.Time, fx fixes, fixStart string) []Check {
	var out []Check
	res, err := rt.Run(ctx, sandbox.Job{ID: "doctor", Code: probeCode, Timeout: 30 * time.Second, OutputCap: 1 << 20}, nil)
	if err == nil && res.Status != sandbox.StatusSuccess {
		err = fmt.Errorf("probe ended %s: %s %s", res.Status, res.Error, strings.TrimSpace(res.Stderr))
	}
	if err != nil {
		return append(out, Check{Name: "sandbox starts", Status: Fail, Detail: err.Error(), Fix: fixStart})
	}
	out = append(out, Check{Name: "sandbox starts", Status: OK, Detail: fmt.Sprintf("a cold container ran the probe in %s", time.Since(start).Round(time.Millisecond))})
	var p probe
	if err := json.Unmarshal([]byte(res.Stdout), &p); err != nil {
		return append(out, Check{Name: "sandbox probe", Status: Fail, Detail: fmt.Sprintf("unreadable probe output %q: %v", res.Stdout, err),
			Fix: "the image's python3 must be Python 3.8 or later"})
	}
	out = append(out, languageCheck(ctx, rt, image), libraryCheck(ctx, rt, image))
	return append(out, limitChecksFor(l, p, fx)...)
}

// fixes are the engine's words in the fix lines of limitChecksFor.
type fixes struct {
	engine  string // "Podman" or "Docker"
	limits  string
	seccomp string
	env     string
}

// languageCheck reports the languages the worker's sandboxes run, running
// JavaScript once where the image says it has it.
func languageCheck(ctx context.Context, rt sandbox.Runtime, image string) Check {
	langs := sandbox.Languages(rt)
	if !slices.Contains(langs, sandbox.JavaScript) {
		return Check{Name: "languages", Status: Warn, Detail: "python only: the image has no Node.js, so this worker takes no run_javascript job",
			Fix: "rebuild the image with Node.js: sudo deploy/sandbox/build.sh --force " + image}
	}
	res, err := rt.Run(ctx, sandbox.Job{ID: "doctor-js", Code: nodeProbe, Language: sandbox.JavaScript, Timeout: 30 * time.Second, OutputCap: 4096}, nil)
	if err == nil && res.Status != sandbox.StatusSuccess {
		err = fmt.Errorf("ended %s: %s %s", res.Status, res.Error, strings.TrimSpace(res.Stderr))
	}
	if err != nil {
		return Check{Name: "languages", Status: Fail, Detail: "the image says it runs JavaScript, but a JavaScript probe failed: " + err.Error(),
			Fix: "rebuild the image: sudo deploy/sandbox/build.sh --force " + image}
	}
	return nodeCheck(res.Stdout, image)
}

// nodeProbe prints the sandbox's Node.js version and whether it was built
// with V8's startup snapshot.
const nodeProbe = `console.log(process.version, process.config.variables.node_use_node_snapshot === false ? "no-snapshot" : "snapshot")`

// nodeCheck reads nodeProbe's output. A Node built without its startup
// snapshot (Debian's) runs its whole bootstrap at each start, about twice
// the CPU of the official build's, and a JavaScript job's executor is
// mostly that start: a warning, with the fix (build.sh falls back to it
// without npm).
func nodeCheck(out, image string) Check {
	version, snapshot, _ := strings.Cut(strings.TrimSpace(out), " ")
	if snapshot == "no-snapshot" {
		return Check{Name: "languages", Status: Warn,
			Detail: "python, javascript (Node.js " + version + ", built without its startup snapshot: each JavaScript job's start costs about twice the CPU of the official build)",
			Fix:    "install npm (apt-get install npm) and rebuild the image with the official Node.js: sudo deploy/sandbox/build.sh --force " + image}
	}
	return Check{Name: "languages", Status: OK, Detail: "python, javascript (Node.js " + version + ")"}
}

// DataLibraries are the Python libraries of the default (data) image, by
// import name: what agents expect of a code interpreter.
var DataLibraries = []string{"numpy", "pandas", "matplotlib", "scipy", "PIL", "openpyxl"}

// libraryProbe prints each data library's version, or null where it is missing.
const libraryProbe = `import importlib, json
libs = {}
for name in %s:
    try:
        libs[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception:
        libs[name] = None
print(json.dumps(libs))`

// libraryCheck lists the data libraries the image has, with their versions.
func libraryCheck(ctx context.Context, rt sandbox.Runtime, image string) Check {
	names, _ := json.Marshal(DataLibraries)
	res, err := rt.Run(ctx, sandbox.Job{ID: "doctor-libs", Code: fmt.Sprintf(libraryProbe, names), Timeout: 60 * time.Second, OutputCap: 4096}, nil)
	if err == nil && res.Status != sandbox.StatusSuccess {
		err = fmt.Errorf("ended %s: %s %s", res.Status, res.Error, strings.TrimSpace(res.Stderr))
	}
	var libs map[string]*string
	if err == nil {
		err = json.Unmarshal([]byte(res.Stdout), &libs)
	}
	if err != nil {
		return Check{Name: "libraries", Status: Fail, Detail: "the data library probe failed: " + err.Error(),
			Fix: "rebuild the image: sudo deploy/sandbox/build.sh --force " + image}
	}
	var have, missing []string
	for _, name := range DataLibraries {
		if v := libs[name]; v != nil {
			have = append(have, name+" "+*v)
		} else {
			missing = append(missing, name)
		}
	}
	fix := "for the data image (numpy, pandas, matplotlib, scipy, Pillow, openpyxl): sudo deploy/sandbox/build.sh --force " + image
	switch {
	case len(have) == 0:
		return Check{Name: "libraries", Status: Warn, Detail: "the standard library only (a slim image): jobs cannot import " + strings.Join(missing, ", "), Fix: fix}
	case len(missing) > 0:
		return Check{Name: "libraries", Status: Warn, Detail: strings.Join(have, ", ") + "; missing: " + strings.Join(missing, ", "), Fix: fix}
	}
	return Check{Name: "libraries", Status: OK, Detail: strings.Join(have, ", ")}
}

// limitChecks compares what a Podman container sees with the configured limits.
func limitChecks(l sandbox.Limits, p probe) []Check {
	return limitChecksFor(l, p, engines[containerpool.Podman].fixes)
}

// limitChecksFor compares what the container sees with the configured limits;
// fx words the fixes for its engine.
func limitChecksFor(l sandbox.Limits, p probe, fx fixes) []Check {
	fixLimits := fx.limits
	var out []Check
	add := func(name string, ok bool, detail, fix string) {
		st := OK
		if !ok {
			st = Fail
		}
		out = append(out, Check{Name: name, Status: st, Detail: detail, Fix: fix})
	}
	num := func(s *string) (int64, bool) {
		if s == nil {
			return 0, false
		}
		n, err := strconv.ParseInt(*s, 10, 64)
		return n, err == nil
	}
	show := func(s *string) string {
		if s == nil {
			return "unreadable"
		}
		return *s
	}
	if l.Memory > 0 {
		n, ok := num(p.Memory)
		add("memory limit", ok && n == l.Memory,
			fmt.Sprintf("configured %s, the container's cgroup says %s", mib(l.Memory), mibOf(p.Memory)), fixLimits)
		if p.MemSw != nil {
			n, ok := num(p.MemSw)
			add("swap limit", ok && (n == l.Memory || n == 0),
				fmt.Sprintf("memory+swap limit %s (want %s: no swap beyond the memory limit)", mibOf(p.MemSw), mib(l.Memory)), fixLimits)
		}
	}
	if l.Pids > 0 {
		n, ok := num(p.Pids)
		add("pids limit", ok && n == l.Pids, fmt.Sprintf("configured %d, the container's cgroup says %s", l.Pids, show(p.Pids)), fixLimits)
	}
	if l.CPUs > 0 {
		got := "unreadable"
		ok := false
		if q, okq := num(p.CPUQuota); okq {
			if per, okp := num(p.CPUPeriod); okp && per > 0 && q > 0 {
				got = fmt.Sprintf("%.2f", float64(q)/float64(per))
				ok = float64(q)/float64(per) <= l.CPUs*1.01
			}
		} else if p.CPUMax != nil {
			f := strings.Fields(*p.CPUMax)
			if len(f) == 2 {
				q, e1 := strconv.ParseFloat(f[0], 64)
				per, e2 := strconv.ParseFloat(f[1], 64)
				if e1 == nil && e2 == nil && per > 0 {
					got = fmt.Sprintf("%.2f", q/per)
					ok = q/per <= l.CPUs*1.01
				}
			}
		}
		add("cpu limit", ok, fmt.Sprintf("configured %.2f CPUs, the container gets %s", l.CPUs, got), fixLimits)
	}
	wantUser := l.User
	add("user", fmt.Sprintf("%d:%d", p.UID, p.GID) == wantUser, fmt.Sprintf("code runs as %d:%d (configured %s)", p.UID, p.GID, wantUser),
		"set --container-user to an unprivileged numeric uid:gid such as 65534:65534")
	add("capabilities", isZeroCaps(p.CapEff) && isZeroCaps(p.CapBnd), fmt.Sprintf("effective %s, bounding %s", p.CapEff, p.CapBnd),
		fx.engine+" must honour --cap-drop ALL: upgrade "+fx.engine)
	add("no_new_privs", p.NoNewPrivs == "1", "NoNewPrivs "+p.NoNewPrivs, fx.engine+" must honour no-new-privileges: upgrade "+fx.engine)
	add("seccomp", p.Seccomp == "2", "Seccomp mode "+p.Seccomp+" (2: filter)", fx.seccomp)
	add("network", slices.Equal(p.Ifaces, []string{"lo"}), fmt.Sprintf("interfaces %v", p.Ifaces), "the sandbox must run with network none: upgrade "+fx.engine)
	add("read-only root", p.Rootfs == "read-only", "root filesystem "+p.Rootfs, fx.engine+" must honour --read-only: upgrade "+fx.engine)
	for _, m := range []struct {
		path string
		opts *string
	}{{"/tmp", p.Tmp}, {"/workspace", p.Workspace}} {
		opts := show(m.opts)
		ok := m.opts != nil && strings.Contains(opts, "noexec") && strings.Contains(opts, "nosuid") && strings.Contains(opts, "nodev")
		add("tmpfs "+m.path, ok, opts, "the tmpfs must be mounted noexec,nosuid,nodev: upgrade "+fx.engine)
	}
	if l.NoFile > 0 {
		add("rlimit nofile", p.NoFile == int64(l.NoFile), fmt.Sprintf("hard limit %d (configured %d)", p.NoFile, l.NoFile), fixLimits)
	}
	if l.NProc > 0 {
		add("rlimit nproc", p.NProc == int64(l.NProc), fmt.Sprintf("hard limit %d (configured %d)", p.NProc, l.NProc), fixLimits)
	}
	var leaked []string
	for _, k := range p.Env {
		switch k {
		// LC_CTYPE is set by Python itself (PEP 538 locale coercion); MPLBACKEND
		// the runner (its matplotlib backend saves figures); the data image
		// and the runner's preload set matplotlib's config dir and the
		// numeric libraries' threads (no secret in any of them).
		case "PATH", "HOME", "PYTHONDONTWRITEBYTECODE", "HOSTNAME", "TERM", "container", "LC_CTYPE",
			"MPLBACKEND", "MPLCONFIGDIR", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS":
		default:
			leaked = append(leaked, k)
		}
	}
	add("environment", len(leaked) == 0, fmt.Sprintf("variables %v", p.Env),
		fmt.Sprintf("variables %v reach the sandbox: %s", leaked, fx.env))
	return out
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// mibOf shows a cgroup limit file's content in MiB when it is a number.
func mibOf(s *string) string {
	if s == nil {
		return "nothing (unreadable: no limit is applied)"
	}
	n, err := strconv.ParseInt(*s, 10, 64)
	if err != nil || n >= 1<<50 {
		return *s + " (no limit)"
	}
	return mib(n)
}

func isZeroCaps(s string) bool { return strings.Trim(s, "0") == "" && s != "" }

// missingImage is the check of an image that is not there: a build under way
// (a front-end or worker building it, --build-image) says how far it got.
func missingImage(image string) Check {
	if p, ok := sandbox.ReadBuildProgress(image); ok {
		return Check{Name: "sandbox image", Status: Warn,
			Detail: fmt.Sprintf("%s is missing and %s (%s ago)", image, p, time.Since(p.Updated).Round(time.Second)),
			Fix:    "wait for the build (about a minute); it runs once per machine"}
	}
	return Check{Name: "sandbox image", Status: Fail, Detail: image + " is missing",
		Fix: fmt.Sprintf("build it: sudo deploy/sandbox/build.sh %s (or `make image`; the worker builds it itself with --build-image)", image)}
}

// probeWorkerID is the worker id of the doctor's runtime: doctor-HOST-PID.
func probeWorkerID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("doctor-%s-%d", strings.NewReplacer(".", "_").Replace(host), os.Getpid())
}

// limitsOrDefault is l, or sandbox.DefaultLimits() when l is the zero value.
func limitsOrDefault(l sandbox.Limits) sandbox.Limits {
	if l == (sandbox.Limits{}) {
		return sandbox.DefaultLimits()
	}
	return l
}

// rootMode names an engine's mode: "rootless" or "rootful".
func rootMode(rootless bool) string {
	if rootless {
		return "rootless"
	}
	return "rootful"
}
