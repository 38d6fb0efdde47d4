package main

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/server"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// httpHandler is the front-end's HTTP surface: /mcp with its task layer, the
// jobs API, the console (/ui/ and /api/console/), /healthz and /metrics,
// behind the configured tokens and origins. stop ends the console's metric
// sampling.
func httpHandler(ctx context.Context, c *config, srv *server.MCPServer, tasks *mcpserver.Tasks, lazy *app.Lazy, m *metrics.Metrics, spans *tracing.Recorder, late *lateTools, rs *oauth.Validator, log *slog.Logger) (h http.Handler, stop func()) {
	history := console.NewHistory(m.Registry, 0)
	history.Start(ctx)
	opts := mcpserver.HTTPOptions{Health: lazy.Health, Tokens: map[string]string{}, Tasks: tasks, AdminTokens: c.servers.adminTokens,
		Extra: map[string]http.Handler{"GET /metrics": mcpserver.MetricsGuard(m.Handler(), c.servers.metricsTokens)}}
	console.Mount(opts.Extra)
	var namespaces []string
	for _, ns := range c.servers.tokens {
		namespaces = append(namespaces, ns)
	}
	for ns := range c.servers.policies {
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	opts.API = lazy.Handler(func(fe *frontend.Frontend) http.Handler {
		return console.Routes(console.Config{Backend: fe, Namespace: mcpserver.NamespaceFromContext, IsAdmin: mcpserver.IsAdmin,
			Namespaces: slices.Compact(namespaces), Spans: spans, History: history, FrontendID: c.id, Logger: log},
			jobsapi.New(jobsapi.Config{Backend: fe, Namespace: mcpserver.NamespaceFromContext, Logger: log}))
	})
	for tok, ns := range c.servers.tokens {
		opts.Tokens[tok] = ns
	}
	if c.authToken != "" {
		opts.Tokens[c.authToken] = jobs.DefaultNamespace
	}
	opts.AllowedHosts = discovery.ParseList(c.servers.allowedHosts)
	opts.OAuth = rs
	for _, o := range strings.Split(c.allowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			opts.AllowedOrigins = append(opts.AllowedOrigins, o)
		}
	}
	return mcpserver.Handler(srv, opts), history.Stop
}
