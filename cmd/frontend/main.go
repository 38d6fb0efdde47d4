// Command frontend is the MCP server agents connect to (stdio, or streamable HTTP
// at /mcp). Without --nats it embeds a broker and one worker: the whole system in
// one process.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/cmd/internal/doctorcmd"
	"github.com/mcpexec/mcpexec/cmd/internal/sandboxflags"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/submit"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func main() {
	cli.Main("frontend", func(ctx context.Context) error {
		if len(os.Args) > 1 && os.Args[1] == "submit" {
			return submit.Run(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
		}
		return run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	})
}

// config is the front-end's parsed command line.
type config struct {
	nats           string
	data           string
	httpAddr       string
	brokerListen   string
	id             string
	workerID       string
	authToken      string
	allowedOrigins string
	slots          int
	limits         jobs.Limits
	level          string
	sandbox        *sandboxflags.Flags
	servers        *serverFlags
	fleet          *fleetFlags
}

func parse(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("frontend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{limits: jobs.DefaultLimits()}
	fs.StringVar(&c.nats, "nats", "", "NATS URL(s) of a broker fleet; absent: embed a broker and one worker")
	fs.StringVar(&c.data, "data", "./data", "embedded mode's data directory")
	fs.StringVar(&c.httpAddr, "http", "", "serve streamable HTTP MCP at /mcp and /healthz on HOST:PORT; absent: MCP on stdio")
	fs.StringVar(&c.brokerListen, "broker-listen", "", "embedded mode: also let other workers and front-ends reach the broker at HOST:PORT")
	fs.StringVar(&c.id, "id", "", "front-end id (its proxy subject); default: random")
	host, _ := os.Hostname()
	fs.StringVar(&c.workerID, "worker-id", embeddedWorkerID(host), "embedded worker's id (labels its containers; a restart removes the previous life's orphans)")
	fs.StringVar(&c.authToken, "auth-token", "", "bearer token required on /mcp (required when --http is not loopback)")
	fs.StringVar(&c.allowedOrigins, "allowed-origins", "", "comma-separated extra Origin hosts allowed on /mcp besides localhost")
	fs.IntVar(&c.slots, "slots", 4, "embedded worker: jobs run at once")
	fs.IntVar(&c.limits.DefaultTimeout, "timeout", c.limits.DefaultTimeout, "default run_python timeout in seconds")
	fs.IntVar(&c.limits.MaxTimeout, "max-timeout", c.limits.MaxTimeout, "largest run_python timeout in seconds")
	fs.IntVar(&c.limits.MaxCodeBytes, "max-code-bytes", c.limits.MaxCodeBytes, "largest accepted code in bytes")
	fs.StringVar(&c.level, "log-level", "info", "log level: debug, info, warn, error")
	c.sandbox = sandboxflags.Register(fs)
	c.servers = registerServerFlags(fs)
	c.fleet = registerFleetFlags(fs)
	if err := cli.Parse(fs, args, sandboxflags.Aliases); err != nil {
		return nil, err
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if c.id == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
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
	if c.httpAddr != "" {
		if _, _, err := net.SplitHostPort(c.httpAddr); err != nil {
			return cli.Usagef("--http %q: want HOST:PORT, e.g. 127.0.0.1:8080", c.httpAddr)
		}
		if !mcpserver.IsLoopback(c.httpAddr) && c.authToken == "" && c.servers.authTokensFile == "" {
			return cli.Usagef("--http %s listens beyond loopback: set --auth-token (or MCPEXEC_AUTH_TOKEN) or --auth-tokens-file so strangers cannot run code", c.httpAddr)
		}
	}
	if err := c.servers.validate(); err != nil {
		return err
	}
	if err := c.fleet.validate(); err != nil {
		return err
	}
	if c.nats == "" {
		if _, err := c.sandbox.Limits(); err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "doctor" {
		return doctorcmd.Main(ctx, "frontend", args[1:], stdout, stderr)
	}
	c, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log, err := cli.Logger(stderr, c.level)
	if err != nil {
		return err
	}
	pool := c.servers.pool(log)
	if err := pool.Start(ctx); err != nil {
		return err
	}
	defer pool.Stop()
	m := metrics.New("frontend")
	wcfg := worker.DefaultConfig(c.workerID)
	wcfg.Slots, wcfg.Logger, wcfg.Grace, wcfg.Metrics = c.slots, log, c.fleet.grace, m
	if err := c.sandbox.ConfigureWorker(&wcfg); err != nil {
		return err
	}
	nopts, err := c.fleet.nats.Options("mcpexec-frontend-"+c.id, log)
	if err != nil {
		return err
	}
	def := c.fleet.policy
	if c.servers.defaultPolicy != nil {
		def = c.servers.defaultPolicy.Inherit(def)
	}
	policies := map[string]frontend.Policy{}
	for ns, p := range c.servers.policies {
		policies[ns] = p.Inherit(def)
	}
	stack, err := app.StartFrontend(ctx, app.FrontendConfig{
		NATSURL:    c.nats,
		NATSOpts:   nopts,
		DataDir:    c.data,
		BrokerAddr: c.brokerListen,
		Frontend: frontend.Config{ID: c.id, Limits: c.limits, Logger: log, Tools: pool,
			CallTimeout: c.servers.callTimeout, MaxCallsPerJob: c.servers.maxCalls, Policy: def, Policies: policies,
			Metrics: m},
		Worker: wcfg,
		NewRuntime: func(ctx context.Context) (sandbox.Runtime, error) {
			return c.sandbox.Open(ctx, wcfg.ID, log)
		},
		Logger:  log,
		Metrics: m,
	})
	if err != nil {
		return err
	}
	defer stack.Close()
	mode := "fleet"
	if c.nats == "" {
		mode = "embedded"
	}
	mopts := mcpserver.Options{Servers: pool.Names, Catalog: pool.Servers, OutputMode: c.servers.outputMode, Metrics: m, Logger: log}
	if c.httpAddr == "" {
		// One caller on stdio: the default memory namespace.
		mopts.Namespace = func(context.Context) string { return mcpserver.DefaultNamespace }
	} else {
		mopts.Namespace = mcpserver.NamespaceFromContext
	}
	srv := mcpserver.New(stack.Frontend, mopts)
	tasks := mcpserver.NewTasks(srv, stack.Frontend, mopts, 0)
	defer tasks.Close()
	if c.httpAddr == "" {
		log.Info("serving MCP on stdio", "frontend", c.id, "mode", mode)
		return serveStdio(ctx, srv, tasks, stack.Frontend, c.fleet.grace, stdin, stdout, log)
	}
	return serveHTTP(ctx, c, srv, tasks, stack.Frontend, m, log, mode)
}

func serveStdio(ctx context.Context, srv *server.MCPServer, tasks *mcpserver.Tasks, fe *frontend.Frontend, grace time.Duration, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	// Task methods are answered in front of mcp-go, from the state service.
	stdin, stdout = tasks.Stdio(stdin, stdout)
	s := server.NewStdioServer(srv)
	s.SetErrorLogger(slog.NewLogLogger(log.Handler(), slog.LevelError))
	// On SIGTERM, in-flight calls get the grace period before the session ends
	// (ending it would cancel their jobs).
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer lcancel()
	go func() {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			fe.Drain(dctx)
			lcancel()
		case <-lctx.Done():
		}
	}()
	err := s.Listen(lctx, stdin, stdout)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func serveHTTP(ctx context.Context, c *config, srv *server.MCPServer, tasks *mcpserver.Tasks, fe *frontend.Frontend, m *metrics.Metrics, log *slog.Logger, mode string) error {
	opts := mcpserver.HTTPOptions{Health: fe.Health, Tokens: map[string]string{}, Tasks: tasks,
		Extra: map[string]http.Handler{"GET /metrics": mcpserver.MetricsGuard(m.Handler(), c.servers.metricsTokens)}}
	opts.API = jobsapi.New(jobsapi.Config{Backend: fe, Namespace: mcpserver.NamespaceFromContext, Logger: log})
	for tok, ns := range c.servers.tokens {
		opts.Tokens[tok] = ns
	}
	if c.authToken != "" {
		opts.Tokens[c.authToken] = mcpserver.DefaultNamespace
	}
	opts.AllowedHosts = discovery.ParseList(c.servers.allowedHosts)
	for _, o := range strings.Split(c.allowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			opts.AllowedOrigins = append(opts.AllowedOrigins, o)
		}
	}
	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another process using the port? choose another with --http)", c.httpAddr, err)
	}
	// No write timeout: /mcp streams results and /api/jobs/{id}/wait may wait
	// minutes; reads, headers and idle connections are bounded.
	hs := &http.Server{Handler: mcpserver.Handler(srv, opts), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "frontend", c.id, "mode", mode)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// In-flight calls get the grace period to receive their job's outcome, then
	// an answer naming the job id to fetch it with later.
	log.Info("front-end stopping: answering in-flight calls", "grace", c.fleet.grace)
	dctx, dcancel := context.WithTimeout(context.Background(), c.fleet.grace)
	defer dcancel()
	drained := make(chan struct{})
	go func() { fe.Drain(dctx); close(drained) }()
	sctx, cancel := context.WithTimeout(context.Background(), c.fleet.grace+5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("HTTP connections still open after the grace period: closing them", "err", err)
		_ = hs.Close()
	}
	<-drained
	return nil
}

// embeddedWorkerID is stable across restarts, so a restarted front-end's worker
// removes the containers its previous life left behind.
func embeddedWorkerID(host string) string {
	id := "embedded-" + host
	if !jobs.ValidID(id) {
		return "embedded"
	}
	return id
}
