// Command frontend is the MCP server agents connect to (stdio, or streamable HTTP
// at /mcp). Without --nats it embeds a broker and one worker: the whole system in
// one process.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/mcpexec/mcpexec/cmd/internal/doctorcmd"
	"github.com/mcpexec/mcpexec/cmd/internal/tracingenv"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func main() {
	cli.Main("frontend", func(ctx context.Context) error {
		if len(os.Args) > 1 && os.Args[1] == "submit" {
			return submitCmd(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
		}
		return run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	})
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
	logReplacedSettings(log)
	tp, spans, stopTraces, err := tracingenv.StartRecording(ctx, "mcpexec-frontend", log)
	if err != nil {
		return err
	}
	defer stopTraces() // last: after the stack's final spans
	dopts := c.servers.discoveryOptions()
	var late lateTools
	pool, since := c.servers.pool(dopts, late.failed, log)
	late.pool = pool
	if err := pool.Start(ctx); err != nil {
		return err
	}
	defer pool.Stop()
	m := metrics.New("frontend")
	late.metrics = m
	wcfg := worker.DefaultConfig(c.workerID)
	wcfg.Slots, wcfg.Logger, wcfg.Grace, wcfg.Metrics, wcfg.Tracing = c.slots, log, c.fleet.grace, m, tp
	wcfg.Queue.QueuedMaxAge = c.queuedMaxAge // the embedded broker's streams follow the worker's queue settings
	wcfg.Queue.AuditMaxAge = c.auditRetention
	if err := c.sandbox.ConfigureWorker(&wcfg); err != nil {
		return err
	}
	nopts, err := c.fleet.nats.Options("mcpexec-frontend-"+c.id, log)
	if err != nil {
		return err
	}
	def, policies := c.policies()
	// The stack (broker, sandbox runtime, worker) starts in the background:
	// MCP clients get initialize and tools/list at once, and run_python says
	// what is missing until it runs.
	lazy := app.StartLazily(app.FrontendConfig{
		NATSURL:    c.nats,
		NATSOpts:   nopts,
		DataDir:    c.data,
		BrokerAddr: c.brokerListen,
		BrokerSync: c.sync,
		Frontend: frontend.Config{ID: c.id, Limits: c.limits, Logger: log, Tools: pool,
			CallTimeout: c.servers.callTimeout, MaxCallsPerJob: c.servers.maxCalls, Policy: def, Policies: policies,
			Metrics: m, OnCatalogChange: late.catalogChanged, Tracing: tp, DescribeStatus: late.describe},
		Worker: wcfg,
		NewRuntime: func(ctx context.Context) (sandbox.Runtime, error) {
			return c.sandbox.Open(ctx, wcfg.ID, log)
		},
		Logger:  log,
		Metrics: m,
	}, startFix)
	defer lazy.Close()
	mode := "fleet"
	if c.nats == "" {
		mode = "embedded"
	}
	langs := c.languages
	if langs == nil { // auto: a fleet's jobs wait for a worker that runs theirs; the embedded worker says once it runs
		langs = jobs.Languages
		if c.nats == "" {
			langs = []string{jobs.LangPython}
		}
	}
	mopts := mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers, OutputMode: c.servers.outputMode, Metrics: m, Logger: log, Languages: langs}
	if len(c.servers.catalog) > 0 {
		mopts.Catalog, mopts.AgentDiscovery = lazy, c.servers.agentDiscovery
	}
	if c.httpAddr == "" {
		// One caller on stdio: the default memory namespace.
		mopts.Namespace = func(context.Context) string { return jobs.DefaultNamespace }
	} else {
		mopts.Namespace = httpauth.Namespace
	}
	srv, tools := mcpserver.NewServer(lazy, mopts)
	late.tools.Store(tools)
	if c.languages == nil && c.nats == "" {
		lazy.OnReady(func(s *app.Stack) { tools.SetLanguages(sandbox.Languages(s.Runtime)) })
	}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchServers(wctx, dopts, since, pool, serversChanged(lazy, tools, log), log)
	}()
	defer func() { stopWatch(); <-watched }()
	tasks := mcpserver.NewTasks(srv, lazy, mopts, 0)
	defer tasks.Close()
	if c.httpAddr == "" {
		log.Info("serving MCP on stdio", "frontend", c.id, "mode", mode, "languages", langs)
		return mcpserver.ServeStdio(ctx, srv, tasks, lazy.Drain, c.fleet.grace, stdin, stdout, log)
	}
	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another process using the port? choose another with --http)", c.httpAddr, err)
	}
	log.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "frontend", c.id, "mode", mode, "languages", langs)
	rs, err := c.oauth.validator(ln.Addr().String(), log)
	if err != nil {
		_ = ln.Close() // not served yet
		return cli.Usagef("--oauth-*: %v", err)
	}
	h, stopConsole := httpHandler(ctx, c, srv, tasks, lazy, m, spans, &late, rs, log)
	defer stopConsole()
	return mcpserver.ServeHTTP(ctx, ln, h, lazy.Drain, c.fleet.grace, log)
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
