package mcpserver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/mark3labs/mcp-go/server"
)

// HTTPOptions configure the HTTP surface.
type HTTPOptions struct {
	// Tokens maps bearer tokens to namespaces. Empty means no auth, which is allowed
	// only on loopback listeners (the caller enforces that).
	Tokens map[string]string
	// AllowedOrigins are extra Origin hosts accepted besides loopback ones.
	AllowedOrigins []string
	// MaxBody bounds a request body in bytes.
	MaxBody int64
	// Health reports nil when the process can do its job.
	Health func(ctx context.Context) error
	// API, when set, is served under /api/ behind the same Origin, auth and size
	// checks as /mcp.
	API http.Handler
	// Extra handlers mounted as given (e.g. "/metrics", "/"), without auth.
	Extra map[string]http.Handler
}

type ctxKey struct{}

// NamespaceFromContext returns the namespace of the authenticated caller, or "".
func NamespaceFromContext(ctx context.Context) string {
	ns, _ := ctx.Value(ctxKey{}).(string)
	return ns
}

// Handler serves streamable HTTP MCP at /mcp and /healthz.
func Handler(s *server.MCPServer, opts HTTPOptions) http.Handler {
	if opts.MaxBody <= 0 {
		opts.MaxBody = 4 << 20
	}
	streamable := server.NewStreamableHTTPServer(s,
		server.WithEndpointPath("/mcp"),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if ns, ok := r.Context().Value(ctxKey{}).(string); ok {
				return context.WithValue(ctx, ctxKey{}, ns)
			}
			return ctx
		}),
	)
	mux := http.NewServeMux()
	mux.Handle("/mcp", guard(streamable, opts))
	if opts.API != nil {
		mux.Handle("/api/", guard(opts.API, opts))
	}
	for pattern, h := range opts.Extra {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if opts.Health != nil {
			if err := opts.Health(r.Context()); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": err.Error()})
				return
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	})
	return mux
}

// guard applies the Origin check (DNS rebinding), bearer-token auth and the body
// size limit.
func guard(next http.Handler, opts HTTPOptions) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && !originAllowed(o, opts.AllowedOrigins) {
			httpError(w, http.StatusForbidden, "forbidden_origin", "Origin "+o+" is not allowed: browsers may reach this server only from localhost pages (or add the origin to --allowed-origins)")
			return
		}
		if len(opts.Tokens) > 0 {
			tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			ns, found := lookupToken(opts.Tokens, strings.TrimSpace(tok))
			if !ok || !found {
				w.Header().Set("WWW-Authenticate", `Bearer realm="mcpexec"`)
				httpError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required: send Authorization: Bearer <token>")
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, ns))
		}
		r.Body = http.MaxBytesReader(w, r.Body, opts.MaxBody)
		next.ServeHTTP(w, r)
	})
}

func lookupToken(tokens map[string]string, tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	for t, ns := range tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(tok)) == 1 {
			return ns, true
		}
	}
	return "", false
}

func originAllowed(origin string, extra []string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, e := range extra {
		if strings.EqualFold(e, host) || strings.EqualFold(e, u.Host) || strings.EqualFold(e, origin) {
			return true
		}
	}
	return false
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// IsLoopback reports whether a listen address binds only loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
