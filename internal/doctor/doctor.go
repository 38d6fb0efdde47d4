// Package doctor checks that a host can run its part of mcpexec, and says how to
// fix what it cannot: the runtime chosen (Podman or Docker) and its API socket,
// that a sandbox really starts with the configured limits (reading them back
// from inside the container, so a limit that is configured but not enforced
// shows), the sandbox image, NATS, JetStream, the streams and, for a front-end,
// that workers and the state service answer, and whether the brokers fsync
// before they acknowledge (their sync policy).
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// Status is the outcome of one check.
type Status string

// Outcomes. Only Fail makes the doctor exit non-zero.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
	Skip Status = "skip"
)

// Check is the outcome of one check.
type Check struct {
	Name   string
	Status Status
	Detail string // what was found
	Fix    string // what to do (Warn and Fail)
}

// Config says what to check.
type Config struct {
	// NATSURL is the broker to check; "" skips the NATS checks (SkipNATSReason
	// says why).
	NATSURL        string
	NATSOpts       []nats.Option
	SkipNATSReason string
	Queue          queue.Config // wire names and expected stream settings
	// ExpectWorkers also checks that a worker and the state service answer (a
	// front-end of a fleet needs both).
	ExpectWorkers bool
	// Sandbox is the container runtime to check; nil skips the sandbox
	// checks (SkipSandboxReason says why).
	Sandbox           *Sandbox
	SkipSandboxReason string
	// RuntimeReason, when set, says which runtime was chosen and why
	// (--runtime); it is reported first.
	RuntimeReason string
	// EmbeddedSync, when set and NATSURL is not, is the sync policy the
	// embedded broker would run with (--sync): it is reported instead of the
	// one the fleet's state replicas announce.
	EmbeddedSync string
	// OAuthIssuers are the front-end's OAuth issuers (--oauth-issuer): each
	// one's metadata and signing keys must be readable.
	OAuthIssuers []string
}

// ErrFailed is returned by Report when a check failed.
var ErrFailed = errors.New("doctor: checks failed")

// Run performs the checks and returns their outcomes in order.
func Run(ctx context.Context, cfg Config) []Check {
	var out []Check
	if cfg.RuntimeReason != "" && cfg.Sandbox != nil {
		out = append(out, Check{Name: "runtime", Status: OK, Detail: cfg.Sandbox.Engine + " (" + cfg.RuntimeReason + ")"})
	}
	switch {
	case cfg.Sandbox != nil:
		out = append(out, checkSandbox(ctx, *cfg.Sandbox)...)
	default:
		out = append(out, Check{Name: "sandbox", Status: Skip, Detail: cfg.SkipSandboxReason})
	}
	if cfg.NATSURL != "" {
		out = append(out, checkNATS(ctx, cfg)...)
	} else {
		out = append(out, Check{Name: "nats", Status: Skip, Detail: cfg.SkipNATSReason})
		if policy := cfg.EmbeddedSync; policy != "" {
			if policy == "always" {
				policy += ", group sync barriers" // the embedded broker is one node
			}
			out = append(out, syncCheck(map[string][]string{policy: {"the embedded broker"}}, "restart the front-end with --sync always (the default; unset MCPEXEC_SYNC)"))
		}
	}
	for _, iss := range cfg.OAuthIssuers {
		out = append(out, checkIssuer(ctx, iss))
	}
	return out
}

// checkIssuer reads an OAuth issuer's metadata and keys as the front-end will.
func checkIssuer(ctx context.Context, iss string) Check {
	n, err := oauth.Probe(ctx, iss)
	if err != nil {
		return Check{Name: "oauth issuer " + iss, Status: Fail, Detail: err.Error(),
			Fix: "check the issuer URL (its /.well-known/openid-configuration must name it as issuer) and that this host reaches it and its jwks_uri"}
	}
	return Check{Name: "oauth issuer " + iss, Status: OK, Detail: fmt.Sprintf("metadata and %d signing keys read", n)}
}

// Report writes checks to w, one line each with the fix under it, and returns
// ErrFailed (wrapped, with the count) when any failed.
func Report(w io.Writer, title string, checks []Check) error {
	fmt.Fprintln(w, title)
	failed, warned := 0, 0
	for _, c := range checks {
		fmt.Fprintf(w, "  %-4s  %-22s %s\n", c.Status, c.Name, c.Detail)
		if c.Fix != "" && (c.Status == Fail || c.Status == Warn) {
			fmt.Fprintf(w, "        %-22s fix: %s\n", "", c.Fix)
		}
		switch c.Status {
		case Fail:
			failed++
		case Warn:
			warned++
		}
	}
	if failed > 0 {
		fmt.Fprintf(w, "%d of %d checks failed, %d warnings\n", failed, len(checks), warned)
		return fmt.Errorf("%w: %d of %d failed (see the fix lines above)", ErrFailed, failed, len(checks))
	}
	fmt.Fprintf(w, "all %d checks passed, %d warnings\n", len(checks), warned)
	return nil
}

// probeCode reads the sandbox's limits from inside it and prints them as JSON.
const probeCode = `import json, os, resource, socket
def read(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
    return None
status = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    status[k] = v.strip()
mounts = {}
for line in open("/proc/self/mounts"):
    f = line.split()
    mounts[f[1]] = f[3]
try:
    open("/doctor-probe", "w")
    rootfs = "writable"
except OSError as e:
    rootfs = "read-only" if e.errno == 30 else "not writable (errno %d)" % e.errno
print(json.dumps({
    "memory": read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
    "memsw": read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes", "/sys/fs/cgroup/memory.swap.max"),
    "pids": read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
    "cpu_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
    "cpu_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"),
    "cpu_max": read("/sys/fs/cgroup/cpu.max"),
    "uid": os.getuid(), "gid": os.getgid(),
    "cap_eff": status.get("CapEff"), "cap_bnd": status.get("CapBnd"),
    "no_new_privs": status.get("NoNewPrivs"), "seccomp": status.get("Seccomp"),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[1],
    "ifaces": [n for _, n in socket.if_nameindex()],
    "rootfs": rootfs,
    "tmp": mounts.get("/tmp"), "workspace": mounts.get("/workspace"),
    "env": sorted(os.environ),
}))`

func checkNATS(ctx context.Context, cfg Config) []Check {
	var out []Check
	opts := append([]nats.Option{nats.Name("mcpexec-doctor"), nats.Timeout(5 * time.Second)}, cfg.NATSOpts...)
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return append(out, Check{Name: "nats", Status: Fail, Detail: fmt.Sprintf("%s: %v", cfg.NATSURL, err),
			Fix: "start the broker (`broker --listen HOST:PORT`) or point --nats (MCPEXEC_NATS) at it; check firewalls and credentials"})
	}
	defer nc.Close()
	rtt, _ := nc.RTT()
	out = append(out, Check{Name: "nats", Status: OK, Detail: fmt.Sprintf("%s (server %s, round trip %s)", nc.ConnectedUrlRedacted(), nc.ConnectedServerVersion(), rtt.Round(time.Microsecond))})
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		return append(out, Check{Name: "jetstream", Status: Fail, Detail: err.Error(),
			Fix: "enable JetStream on the NATS server (the mcpexec broker does): use `broker`, or start nats-server with -js"})
	}
	out = append(out, Check{Name: "jetstream", Status: OK, Detail: "enabled"})
	s := cfg.Queue.Subjects
	fixStreams := "start (or restart) the mcpexec broker of this version: it creates and updates the streams"
	if st, err := js.Stream(ctx, s.JobsStream()); err != nil {
		out = append(out, Check{Name: "stream " + s.JobsStream(), Status: Fail, Detail: err.Error(), Fix: fixStreams})
	} else {
		c := st.CachedInfo().Config
		var bad []string
		if c.Retention != jetstream.WorkQueuePolicy {
			bad = append(bad, "retention "+c.Retention.String()+" (want work queue)")
		}
		for _, want := range []string{s.AllJobs(), s.AllWorkerJobs()} {
			if !slices.Contains(c.Subjects, want) {
				bad = append(bad, "subject "+want+" missing")
			}
		}
		if c.Duplicates <= 0 {
			bad = append(bad, "no duplicate window")
		}
		if c.Discard != jetstream.DiscardNew {
			bad = append(bad, "discard policy old (a full queue would drop accepted jobs)")
		}
		detail := fmt.Sprintf("work queue on %v, %d pending, max %d, dedupe %s, replicas %d",
			c.Subjects, st.CachedInfo().State.Msgs, c.MaxMsgs, c.Duplicates, c.Replicas)
		if len(bad) > 0 {
			out = append(out, Check{Name: "stream " + s.JobsStream(), Status: Fail, Detail: strings.Join(bad, "; "), Fix: fixStreams})
		} else {
			out = append(out, Check{Name: "stream " + s.JobsStream(), Status: OK, Detail: detail})
		}
	}
	if st, err := js.Stream(ctx, s.EventsStream()); err != nil {
		out = append(out, Check{Name: "stream " + s.EventsStream(), Status: Fail, Detail: err.Error(), Fix: fixStreams})
	} else {
		c := st.CachedInfo().Config
		if !slices.Contains(c.Subjects, s.AllEvents()) {
			out = append(out, Check{Name: "stream " + s.EventsStream(), Status: Fail, Detail: "subject " + s.AllEvents() + " missing", Fix: fixStreams})
		} else {
			out = append(out, Check{Name: "stream " + s.EventsStream(), Status: OK,
				Detail: fmt.Sprintf("%d events, kept %s, replicas %d", st.CachedInfo().State.Msgs, c.MaxAge, c.Replicas)})
		}
	}
	if _, err := js.KeyValue(ctx, s.SessionsBucket()); err != nil {
		out = append(out, Check{Name: "sessions bucket", Status: Fail, Detail: err.Error(), Fix: fixStreams})
	} else {
		out = append(out, Check{Name: "sessions bucket", Status: OK, Detail: s.SessionsBucket()})
	}
	// Approvals and the audit trail: a broker older than them runs jobs all
	// the same, but refuses every call a tool rule asks a person about, and
	// keeps no trail.
	if _, err := js.KeyValue(ctx, s.ApprovalsBucket()); err != nil {
		out = append(out, Check{Name: "approvals bucket", Status: Warn, Fix: fixStreams,
			Detail: err.Error() + ": a tool call whose rule is \"ask\" is refused, as nobody can be asked"})
	} else {
		out = append(out, Check{Name: "approvals bucket", Status: OK, Detail: s.ApprovalsBucket()})
	}
	if st, err := js.Stream(ctx, s.AuditStream()); err != nil {
		out = append(out, Check{Name: "stream " + s.AuditStream(), Status: Warn, Fix: fixStreams,
			Detail: err.Error() + ": the proxied tool calls' audit entries cannot be kept"})
	} else {
		c := st.CachedInfo().Config
		out = append(out, Check{Name: "stream " + s.AuditStream(), Status: OK,
			Detail: fmt.Sprintf("%d messages of audit entries, kept %s, replicas %d", st.CachedInfo().State.Msgs, c.MaxAge, c.Replicas)})
	}
	if cfg.ExpectWorkers {
		out = append(out, ping(ctx, nc, s.WorkerService(), "workers", "start at least one worker: `worker --nats "+cfg.NATSURL+"`"))
		out = append(out, workerHealth(ctx, nc, s)...)
		out = append(out, ping(ctx, nc, s.StateService(), "state service", "start the broker: it hosts the state service (jobs, results, memory)"))
		out = append(out, fleetSync(ctx, nc, s.StateService()))
	}
	return out
}

// fleetSync reports the sync policy of the brokers whose state replicas
// answer $SRV.INFO.<service> within a second.
func fleetSync(ctx context.Context, nc *nats.Conn, service string) Check {
	const fix = "restart the brokers named with --sync always (the default; unset MCPEXEC_SYNC)"
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Check{Name: "sync", Status: Warn, Detail: err.Error()}
	}
	defer func() { _ = sub.Unsubscribe() }() // fails only when the connection is closed, which drops the subscription too
	if err := nc.PublishRequest("$SRV.INFO."+service, inbox, nil); err != nil {
		return Check{Name: "sync", Status: Warn, Detail: err.Error()}
	}
	nodes := map[string][]string{} // policy: nodes
	deadline := time.Now().Add(time.Second)
	for {
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			break
		}
		m, err := sub.NextMsg(wait)
		if err != nil {
			break
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			continue
		}
		policy, ok := info.Metadata[queue.SyncMetadata]
		if !ok {
			// Brokers before the sync policy ran with nats-server's default.
			policy = "interval:2m0s (a broker older than --sync)"
		}
		if durable.ModeOf(info.Metadata) == durable.ModeBarrier {
			// One node: JetStream acknowledges at once, and every writer
			// waits for a group sync before it reports success.
			policy += ", group sync barriers"
		}
		node := info.Metadata["node"]
		if node == "" {
			node = info.ID
		}
		nodes[policy] = append(nodes[policy], node)
	}
	if len(nodes) == 0 {
		return Check{Name: "sync", Status: Skip, Detail: "no state replica answered $SRV.INFO." + service + " with its broker's policy"}
	}
	return syncCheck(nodes, fix)
}

// syncCheck is OK when every broker fsyncs before it acknowledges, else a
// warning naming the brokers that do not.
func syncCheck(nodes map[string][]string, fix string) Check {
	var parts []string
	warn := false
	for _, policy := range slices.Sorted(maps.Keys(nodes)) {
		names := slices.Sorted(slices.Values(nodes[policy]))
		parts = append(parts, policy+" ("+strings.Join(names, ", ")+")")
		warn = warn || !strings.HasPrefix(policy, "always")
	}
	detail := strings.Join(parts, "; ")
	if !warn {
		return Check{Name: "sync", Status: OK, Detail: detail + ": writes reach the disk before they are acknowledged"}
	}
	return Check{Name: "sync", Status: Warn, Detail: detail + ": with an interval, a power cut loses acknowledged jobs and memory writes", Fix: fix}
}

// ping counts the instances of a NATS micro service that answer within a second.
func ping(ctx context.Context, nc *nats.Conn, service, name, fix string) Check {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Check{Name: name, Status: Fail, Detail: err.Error(), Fix: fix}
	}
	defer func() { _ = sub.Unsubscribe() }() // fails only when the connection is closed, which drops the subscription too
	if err := nc.PublishRequest("$SRV.PING."+service, inbox, nil); err != nil {
		return Check{Name: name, Status: Fail, Detail: err.Error(), Fix: fix}
	}
	n := 0
	deadline := time.Now().Add(time.Second)
	for {
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			break
		}
		if _, err := sub.NextMsg(wait); err != nil {
			break
		}
		n++
	}
	if n == 0 {
		return Check{Name: name, Status: Fail, Detail: "none answered $SRV.PING." + service, Fix: fix}
	}
	return Check{Name: name, Status: OK, Detail: fmt.Sprintf("%d answering", n)}
}

// workerHealth reports each worker that says it takes no jobs, and why.
func workerHealth(ctx context.Context, nc *nats.Conn, s jobs.Subjects) []Check {
	ws, err := queue.WorkerStatuses(ctx, nc, s, time.Second)
	if err != nil {
		return []Check{{Name: "worker health", Status: Warn, Detail: err.Error()}}
	}
	var out []Check
	healthy := 0
	byLang := map[string]int{}
	for _, w := range ws {
		if w.Healthy {
			healthy++
			for _, l := range w.Languages {
				byLang[l]++
			}
			if len(w.Languages) == 0 { // a worker of a version before languages
				byLang[jobs.LangPython]++
			}
			continue
		}
		out = append(out, Check{Name: "worker " + w.ID, Status: Warn, Detail: "takes no jobs: " + w.Reason,
			Fix: "run `worker doctor` on that host; the worker probes its runtime and resumes by itself once it can start sandboxes"})
	}
	if len(ws) > 0 && healthy == 0 {
		out = append(out, Check{Name: "worker health", Status: Fail, Detail: "no healthy worker is left",
			Fix: "fix the workers' runtimes (see above), or start a worker on another host"})
	}
	if healthy > 0 {
		var parts []string
		missing := ""
		for _, l := range jobs.Languages {
			parts = append(parts, fmt.Sprintf("%s: %d", l, byLang[l]))
			if byLang[l] == 0 && missing == "" {
				missing = l
			}
		}
		c := Check{Name: "worker languages", Status: OK, Detail: "healthy workers by language: " + strings.Join(parts, ", ")}
		if missing != "" {
			c.Status, c.Fix = Warn, "no worker runs "+missing+": its jobs wait until one does; run a worker whose image has it (sudo deploy/sandbox/build.sh --force)"
		}
		out = append(out, c)
	}
	return out
}
