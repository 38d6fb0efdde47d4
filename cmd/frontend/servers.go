package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
)

// serverFlags are the flags about proxied MCP servers and the MCP surface.
type serverFlags struct {
	files          fileList
	catalog        fileList
	agentDiscovery bool
	discover       bool
	allow, deny    string
	idleTimeout    time.Duration
	callTimeout    time.Duration
	maxCalls       int
	outputMode     string
	authTokensFile string
	allowedHosts   string
	tokens         map[string]string // loaded from authTokensFile
	// From authTokensFile too: the default policy (nil: the flags') and each
	// named namespace's, and the tokens that may read /metrics.
	defaultPolicy *frontend.Policy
	policies      map[string]frontend.Policy
	metricsTokens []string
	adminTokens   []string // act in any namespace (the console's admin view)
	// oauthNamespaces maps an OAuth namespace claim's values to namespaces.
	oauthNamespaces map[string]string
}

// fileList is a repeatable flag; one value may hold several paths separated by
// the OS list separator (as MCPEXEC_SERVERS does).
type fileList []string

func (l *fileList) String() string { return strings.Join(*l, string(os.PathListSeparator)) }

func (l *fileList) Set(v string) error {
	for _, p := range filepath.SplitList(v) {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

func registerServerFlags(fs *flag.FlagSet) *serverFlags {
	sf := &serverFlags{}
	fs.Var(&sf.files, "servers", "MCP servers config file ({\"mcpServers\": {...}}) to proxy; repeatable; MCP_SERVERS_CONFIG and the usual client config locations are read too")
	fs.Var(&sf.catalog, "catalog", "server catalog file (same mcpServers form): servers known but not enabled, which a namespace's code finds with find_servers and enables with enable_server; repeatable")
	fs.BoolVar(&sf.agentDiscovery, "agent-discovery", false, "offer the server catalog as MCP tools too (find_servers, enable_server, disable_server); needs --catalog")
	fs.BoolVar(&sf.discover, "discover", true, "also read the usual client config locations (Claude, Cursor, VS Code, ~/.config/mcp/servers, ./mcp-servers)")
	fs.StringVar(&sf.allow, "allow-servers", "", "comma-separated names or globs of the only servers that may be used")
	fs.StringVar(&sf.deny, "deny-servers", "", "comma-separated names or globs of servers that may not be used (wins over --allow-servers)")
	fs.DurationVar(&sf.idleTimeout, "server-idle-timeout", 5*time.Minute, "close an MCP server session unused this long")
	fs.DurationVar(&sf.callTimeout, "call-timeout", 60*time.Second, "default limit of one proxied tool call (the job's deadline also bounds it)")
	fs.IntVar(&sf.maxCalls, "max-calls-per-job", 8, "proxied calls one job may have in flight")
	fs.StringVar(&sf.outputMode, "output-mode", "text", "run_python's text output: text (compact) or toon")
	fs.StringVar(&sf.authTokensFile, "auth-tokens-file", "", "file mapping bearer tokens to memory namespaces (JSON object, or lines \"TOKEN NAMESPACE\")")
	fs.StringVar(&sf.allowedHosts, "allowed-hosts", "", "comma-separated extra Host names accepted on a loopback listener (e.g. a local reverse proxy's)")
	return sf
}

func (sf *serverFlags) policy() discovery.Policy {
	return discovery.Policy{Allow: discovery.ParseList(sf.allow), Deny: discovery.ParseList(sf.deny)}
}

func (sf *serverFlags) validate() error {
	if err := sf.policy().Validate(); err != nil {
		return cli.Usagef("--allow-servers/--deny-servers: %v", err)
	}
	if !mcpserver.ValidOutputMode(sf.outputMode) {
		return cli.Usagef("--output-mode %q: want text or toon", sf.outputMode)
	}
	if sf.agentDiscovery && len(sf.catalog) == 0 {
		return cli.Usagef("--agent-discovery offers the server catalog, but no --catalog FILE names one")
	}
	if sf.idleTimeout <= 0 || sf.callTimeout <= 0 {
		return cli.Usagef("--server-idle-timeout and --call-timeout must be positive")
	}
	if sf.maxCalls < 1 {
		return cli.Usagef("--max-calls-per-job must be at least 1, got %d", sf.maxCalls)
	}
	if sf.authTokensFile != "" {
		f, err := mcpserver.LoadTokensFile(sf.authTokensFile)
		if err != nil {
			return cli.Usagef("--auth-tokens-file: %v", err)
		}
		sf.tokens, sf.metricsTokens, sf.adminTokens = f.Tokens, f.MetricsTokens, f.AdminTokens
		sf.oauthNamespaces = f.OAuthNamespaces
		if len(f.DefaultPolicy) > 0 {
			p, err := decodePolicy(f.DefaultPolicy)
			if err != nil {
				return cli.Usagef("--auth-tokens-file %s: default_policy: %v", sf.authTokensFile, err)
			}
			sf.defaultPolicy = &p
		}
		sf.policies = map[string]frontend.Policy{}
		for ns, raw := range f.Namespaces {
			p, err := decodePolicy(raw)
			if err != nil {
				return cli.Usagef("--auth-tokens-file %s: namespace %q: %v", sf.authTokensFile, ns, err)
			}
			sf.policies[ns] = p
		}
	}
	return nil
}

// decodePolicy reads one policy object, refusing unknown fields.
func decodePolicy(raw json.RawMessage) (frontend.Policy, error) {
	var p frontend.Policy
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("want {servers, pools, max_timeout, max_memory_mb, max_cpus, max_queued, max_active, max_queued_bytes, max_sessions, memory_bytes, files_bytes, max_file_bytes, max_job_files_bytes, max_files, redact, tools, tool_defaults, approval_timeout, max_pending_approvals_per_job, max_pending_approvals}: %w", err)
	}
	return p, p.Validate()
}

// discoveryOptions says where the proxied servers' configs are read from.
func (sf *serverFlags) discoveryOptions() discovery.Options {
	opts := discovery.Options{
		Files:     sf.files,
		EnvConfig: os.Getenv("MCP_SERVERS_CONFIG"),
		Policy:    sf.policy(),
		LookupEnv: os.LookupEnv,
		AllowSelf: cli.Truthy(os.Getenv("MCP_BRIDGE_ALLOW_SELF_SERVER")),
		Catalog:   sf.catalog,
	}
	if self, err := os.Executable(); err == nil {
		opts.Self = self
	}
	if sf.discover {
		opts.Home, _ = os.UserHomeDir()
		opts.ConfigHome = os.Getenv("XDG_CONFIG_HOME")
		opts.Cwd, _ = os.Getwd()
	}
	return opts
}

// logDiscovery logs what a discovery found and could not use.
func logDiscovery(res discovery.Result, log *slog.Logger) {
	for _, p := range res.Problems {
		log.Warn("MCP servers config not used", "file", p.Source, "reason", p.Err.Error())
	}
	for _, s := range res.Skipped {
		log.Info("MCP server skipped", "server", s.Name, "file", s.Source, "reason", s.Reason)
	}
	var names, catalog []string
	for _, s := range res.Servers {
		if s.Catalog {
			catalog = append(catalog, s.Name)
		} else {
			names = append(names, s.Name)
		}
	}
	log.Info("MCP servers discovered", "count", len(names), "servers", strings.Join(names, ","), "catalog", strings.Join(catalog, ","))
}

// pool discovers the servers and returns the client pool (not started) and
// the configs' fingerprint it was read at (watchServers' start). A server that
// fails to start is told to failed.
func (sf *serverFlags) pool(opts discovery.Options, failed func(server string, err error), log *slog.Logger) (*mcpclients.Pool, string) {
	since := discovery.Fingerprint(opts)
	res := discovery.Discover(opts)
	logDiscovery(res, log)
	return mcpclients.New(res.Servers, mcpclients.Config{
		IdleTimeout:    sf.idleTimeout,
		Policy:         sf.policy(),
		Logger:         log.With("component", "mcpclients"),
		OnStartFailure: failed,
	}), since
}

// watchServers rereads the configs when they change (a file added, changed
// or removed takes effect within two seconds), updates pool, and has clients
// told of the new servers enum (refresh). It returns when ctx ends.
func watchServers(ctx context.Context, opts discovery.Options, since string, pool *mcpclients.Pool, refresh func(), log *slog.Logger) {
	discovery.Watch(ctx, opts, since, 0, func(res discovery.Result) {
		logDiscovery(res, log)
		added, changed, removed := pool.Update(res.Servers)
		if len(added)+len(changed)+len(removed) == 0 {
			return
		}
		log.Info("MCP servers config changed", "added", added, "changed", changed, "removed", removed)
		refresh()
	})
}

// serversChanged is what a new discovery sets off: the front-end answers the
// proxy calls of the servers it has now, and clients hear of the new enum.
func serversChanged(lazy *app.Lazy, tools *mcpserver.Tools, log *slog.Logger) func() {
	return func() {
		if s, err := lazy.Stack(); err == nil {
			if err := s.Frontend.ServersChanged(); err != nil {
				log.Warn("answer the proxy calls of the new servers", "err", err)
			}
		}
		tools.Refresh()
	}
}

// lateTools holds what the hooks made before them need: the MCP server's
// Tools (until set, the hooks leave it out), the client pool and the
// process's metrics.
type lateTools struct {
	tools   atomic.Pointer[mcpserver.Tools]
	pool    *mcpclients.Pool
	metrics *metrics.Metrics
}

// describe completes the front-end's status answers: its servers and its
// proxy calls over the last minute.
func (f *lateTools) describe(st *jobs.FrontendStatus) {
	for _, name := range f.pool.Names() {
		st.Servers = append(st.Servers, jobs.ServerState{Name: name, Running: f.pool.Running(name)})
	}
	st.CallsPerMinute = f.metrics.ProxyCallsPerMinute()
}

// catalogChanged is the front-end's catalog hook: a namespace's servers
// enum changed, so clients hear notifications/tools/list_changed.
func (f *lateTools) catalogChanged(string) {
	if t := f.tools.Load(); t != nil {
		t.Refresh()
	}
}

// failed is the pool's start-failure hook: each failure is an MCP log
// message to the agents' clients.
func (f *lateTools) failed(server string, err error) {
	if t := f.tools.Load(); t != nil {
		t.Log(mcp.LoggingLevelError, map[string]any{"event": "server_failed", "server": server, "error": err.Error()})
	}
}
