package main

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/server"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
)

// httpHandler is the front-end's HTTP surface: /mcp with its task layer, the
// jobs API, /healthz and /metrics, behind the configured tokens and origins.
func httpHandler(c *config, srv *server.MCPServer, tasks *mcpserver.Tasks, lazy *app.Lazy, m *metrics.Metrics, log *slog.Logger) http.Handler {
	opts := mcpserver.HTTPOptions{Health: lazy.Health, Tokens: map[string]string{}, Tasks: tasks,
		Extra: map[string]http.Handler{"GET /metrics": mcpserver.MetricsGuard(m.Handler(), c.servers.metricsTokens)}}
	opts.API = lazy.Handler(func(fe *frontend.Frontend) http.Handler {
		return jobsapi.New(jobsapi.Config{Backend: fe, Namespace: mcpserver.NamespaceFromContext, Logger: log})
	})
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
	return mcpserver.Handler(srv, opts)
}
