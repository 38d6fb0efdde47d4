package main

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/server"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
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
	// Authentication is built once, here: /mcp and /api/ (mcpserver.Handler
	// puts it in front of them), /metrics, and the OAuth metadata.
	tokens := maps.Clone(c.servers.tokens)
	if tokens == nil {
		tokens = map[string]string{}
	}
	if c.authToken != "" {
		tokens[c.authToken] = jobs.DefaultNamespace
	}
	auth := httpauth.New(httpauth.Config{Tokens: tokens, AdminTokens: c.servers.adminTokens, MetricsTokens: c.servers.metricsTokens, OAuth: rs})
	opts := mcpserver.HTTPOptions{Health: lazy.Health, Tasks: tasks, Auth: auth,
		Extra: map[string]http.Handler{"GET /metrics": auth.Metrics(m.Handler())}}
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
		// The console and the jobs API read the caller auth put in the
		// request's context (httpauth.FromContext).
		return console.Routes(console.Config{Backend: fe,
			Namespaces: slices.Compact(namespaces), Spans: spans, History: history, FrontendID: c.id, Logger: log},
			jobsapi.New(jobsapi.Config{Backend: fe, Logger: log}))
	})
	opts.AllowedHosts = discovery.ParseList(c.servers.allowedHosts)
	for _, o := range strings.Split(c.allowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			opts.AllowedOrigins = append(opts.AllowedOrigins, o)
		}
	}
	return mcpserver.Handler(srv, opts), history.Stop
}
