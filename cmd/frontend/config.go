package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/cmd/internal/sandboxflags"
	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// config is the front-end's parsed command line.
type config struct {
	nats           string
	data           string
	httpAddr       string
	brokerListen   string
	sync           broker.SyncPolicy
	id             string
	workerID       string
	authToken      string
	allowedOrigins string
	slots          int
	queuedMaxAge   time.Duration // embedded broker's jobs stream MaxAge
	auditRetention time.Duration // embedded broker's audit trail retention
	limits         jobs.Limits
	level          string
	languages      []string // nil: auto
	sandbox        *sandboxflags.Flags
	servers        *serverFlags
	fleet          *fleetFlags
	oauth          *oauthFlags
}

func parse(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("frontend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{limits: jobs.DefaultLimits()}
	fs.StringVar(&c.nats, "nats", "", "NATS URL(s) of a broker fleet; absent: embed a broker and one worker")
	fs.StringVar(&c.data, "data", "./data", "embedded mode's data directory")
	fs.StringVar(&c.httpAddr, "http", "", "serve streamable HTTP MCP at /mcp and /healthz on HOST:PORT; absent: MCP on stdio")
	fs.StringVar(&c.brokerListen, "broker-listen", "", "embedded mode: also let other workers and front-ends reach the broker at HOST:PORT")
	fs.Var(&c.sync, "sync", "embedded mode: "+broker.SyncUsage)
	fs.StringVar(&c.id, "id", "", "front-end id (its proxy subject); default: random")
	host, _ := os.Hostname()
	fs.StringVar(&c.workerID, "worker-id", embeddedWorkerID(host), "embedded worker's id (labels its containers; a restart removes the previous life's orphans)")
	fs.StringVar(&c.authToken, "auth-token", "", "bearer token required on /mcp (required when --http is not loopback)")
	fs.StringVar(&c.allowedOrigins, "allowed-origins", "", "comma-separated extra Origin hosts allowed on /mcp besides localhost")
	fs.IntVar(&c.slots, "slots", 4, "embedded worker: jobs run at once")
	fs.DurationVar(&c.queuedMaxAge, "queued-max-age", queue.DefaultQueuedMaxAge, "embedded broker: a job no worker took within this is removed from the queue and recorded as rejected (at least 10m, at most 168h)")
	fs.DurationVar(&c.auditRetention, "audit-retention", queue.DefaultAuditRetention, "embedded broker: how long the audit trail of proxied tool calls keeps an entry (at least 10m)")
	fs.IntVar(&c.limits.DefaultTimeout, "timeout", c.limits.DefaultTimeout, "default run_python timeout in seconds")
	fs.IntVar(&c.limits.MaxTimeout, "max-timeout", c.limits.MaxTimeout, "largest run_python timeout in seconds")
	fs.IntVar(&c.limits.MaxCodeBytes, "max-code-bytes", c.limits.MaxCodeBytes, "largest accepted code in bytes")
	fs.StringVar(&c.level, "log-level", "info", "log level: debug, info, warn, error")
	langs := fs.String("languages", "auto", "languages offered, one tool each (python: run_python, javascript: run_javascript), e.g. python,javascript; auto: what the embedded worker's sandboxes run, or both with --nats")
	c.sandbox = sandboxflags.Register(fs)
	c.servers = registerServerFlags(fs)
	c.fleet = registerFleetFlags(fs)
	c.oauth = registerOAuthFlags(fs)
	if err := cli.Parse(fs, args, aliases()); err != nil {
		return nil, err
	}
	c.level = bridgeLevel(c.level)
	if c.servers.outputMode == "compact" { // the seed bridge's name of the text mode
		c.servers.outputMode = mcpserver.OutputText
	}
	var err error
	if c.languages, err = parseLanguages(*langs); err != nil {
		return nil, err
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if c.id == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b) // never fails
		c.id = "fe-" + hex.EncodeToString(b)
	}
	if !jobs.ValidID(c.id) {
		return cli.Usagef("--id %q: use letters, digits, '-' or '_'", c.id)
	}
	if !jobs.ValidID(c.workerID) {
		return cli.Usagef("--worker-id %q: use letters, digits, '-' or '_'", c.workerID)
	}
	if c.limits.MaxTimeout < 1 || c.limits.DefaultTimeout < 1 || c.limits.DefaultTimeout > c.limits.MaxTimeout {
		return cli.Usagef("--timeout (%d) must be between 1 and --max-timeout (%d)", c.limits.DefaultTimeout, c.limits.MaxTimeout)
	}
	if c.limits.MaxCodeBytes < 1 {
		return cli.Usagef("--max-code-bytes must be positive")
	}
	if c.slots < 1 {
		return cli.Usagef("--slots must be at least 1, got %d", c.slots)
	}
	q := queue.DefaultConfig()
	q.QueuedMaxAge, q.AuditMaxAge = c.queuedMaxAge, c.auditRetention
	if err := q.Validate(); err != nil {
		return cli.Usagef("--queued-max-age %s, --audit-retention %s: %v", c.queuedMaxAge, c.auditRetention, err)
	}
	if c.httpAddr != "" {
		if _, _, err := net.SplitHostPort(c.httpAddr); err != nil {
			return cli.Usagef("--http %q: want HOST:PORT, e.g. 127.0.0.1:8080", c.httpAddr)
		}
		if !mcpserver.IsLoopback(c.httpAddr) && c.authToken == "" && c.servers.authTokensFile == "" && len(c.oauth.issuers) == 0 {
			return cli.Usagef("--http %s listens beyond loopback: set --auth-token (or MCPEXEC_AUTH_TOKEN), --auth-tokens-file or --oauth-issuer so strangers cannot run code", c.httpAddr)
		}
	}
	if err := c.servers.validate(); err != nil {
		return err
	}
	if err := c.fleet.validate(); err != nil {
		return err
	}
	if err := c.oauth.validate(c.httpAddr, c.servers.oauthNamespaces); err != nil {
		return err
	}
	if c.nats == "" {
		if _, err := c.sandbox.Limits(); err != nil {
			return err
		}
	}
	return nil
}

// parseLanguages reads --languages: "auto" (nil), or a list that names python.
func parseLanguages(v string) ([]string, error) {
	if v == "auto" {
		return nil, nil
	}
	var out []string
	for _, l := range strings.Split(v, ",") {
		l = strings.TrimSpace(l)
		if !slices.Contains(jobs.Languages, l) {
			return nil, cli.Usagef("--languages %q: %q is not one of %s (or auto)", v, l, strings.Join(jobs.Languages, ", "))
		}
		out = append(out, l)
	}
	if !slices.Contains(out, jobs.LangPython) {
		return nil, cli.Usagef("--languages %q: python is always offered; list it too", v)
	}
	return out, nil
}

// aliases are the environment names of the seed bridge (MCP_BRIDGE_*) the
// front-end's flags honour, besides their MCPEXEC_* names.
func aliases() map[string][]string {
	a := map[string][]string{
		"output-mode": {"MCP_BRIDGE_OUTPUT_MODE"},
		"log-level":   {"MCP_BRIDGE_LOG_LEVEL"},
		"data":        {"MCP_BRIDGE_STATE_DIR"},
	}
	maps.Copy(a, sandboxflags.Aliases)
	return a
}

// bridgeLevel maps Python's logging level names (the seed bridge's
// MCP_BRIDGE_LOG_LEVEL) onto slog's.
func bridgeLevel(l string) string {
	switch strings.ToLower(l) {
	case "warning":
		return "warn"
	case "critical", "fatal":
		return "error"
	}
	return l
}

// replacedSettings are the seed bridge's settings mcpexec does not take, and
// what replaces each.
var replacedSettings = map[string]string{
	"MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT": "mcpexec keeps --pool warm sandboxes and reuses each per namespace; an idle one is removed after 2 minutes, and the Podman service it started ends with the front-end",
}

// logReplacedSettings says once, at start, which bridge settings are set but
// replaced, and by what.
func logReplacedSettings(log *slog.Logger) {
	for _, name := range slices.Sorted(maps.Keys(replacedSettings)) {
		if v, ok := os.LookupEnv(name); ok {
			log.Warn("setting of mcp-server-code-execution-mode not used", "name", name, "value", v, "instead", replacedSettings[name])
		}
	}
}

// policies returns the default namespace policy (the flags', with the tokens
// file's default_policy over it) and each named namespace's, inheriting it.
func (c *config) policies() (frontend.Policy, map[string]frontend.Policy) {
	def := c.fleet.policy
	if c.servers.defaultPolicy != nil {
		def = c.servers.defaultPolicy.Inherit(def)
	}
	policies := map[string]frontend.Policy{}
	for ns, p := range c.servers.policies {
		policies[ns] = p.Inherit(def)
	}
	return def, policies
}
