package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/mcpexec/mcpexec/internal/cli"

	"github.com/mark3labs/mcp-go/server"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/slots"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// HTTPOptions configure the HTTP surface.
type HTTPOptions struct {
	// Auth authenticates /mcp (scope mcpexec:run) and /api/ (mcpexec:jobs)
	// and serves the OAuth resource metadata; nil or one without tokens
	// means no auth, which is allowed only on loopback listeners (the
	// caller enforces that).
	Auth *httpauth.Auth
	// AllowedOrigins are extra Origin hosts accepted besides loopback ones.
	AllowedOrigins []string
	// AllowedHosts are extra Host header values accepted on connections to a
	// loopback address (e.g. a reverse proxy's name). Loopback names always are.
	AllowedHosts []string
	// MaxBody bounds a request body in bytes.
	MaxBody int64
	// Health reports nil when the process can do its job.
	Health func(ctx context.Context) error
	// API, when set, is served under /api/ behind the same Origin, auth and size
	// checks as /mcp.
	API http.Handler
	// Extra handlers mounted as given (e.g. "/metrics", "/"), without auth.
	Extra map[string]http.Handler
	// Tasks, when set, answers the task methods in front of s (NewTasks).
	Tasks *Tasks
	// SessionKey signs MCP session ids to the namespace that opened them
	// (empty: a random key, so sessions are this process's own). Front-ends
	// of one fleet that share it accept each other's sessions.
	SessionKey []byte
	// MaxRequestsPerToken bounds the requests one token has in flight at
	// once (waits, synchronous runs, event streams); 0: DefaultMaxRequestsPerToken.
	MaxRequestsPerToken int

	inFlight *slots.Keyed // set by Handler
}

// DefaultMaxRequestsPerToken is the requests one token may have in flight on
// one front-end: long ones (a synchronous run, /wait, tasks/result, an event
// stream) hold a connection and a goroutine each.
const DefaultMaxRequestsPerToken = 64

// ownSessionsOnly refuses a request carrying an MCP session id that its
// namespace did not open, whatever its method (a GET would otherwise listen
// to another tenant's notifications, a DELETE end its session).
func ownSessionsOnly(ids *sessionIDs, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get(server.HeaderKeySessionID); sid != "" && !ids.sessionOwned(r.Context(), sid) {
			httperr.Write(w, http.StatusNotFound, "unknown_session", "no such MCP session for this token: start a new one with initialize")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Handler serves streamable HTTP MCP at /mcp and /healthz.
func Handler(s *server.MCPServer, opts HTTPOptions) http.Handler {
	if opts.MaxBody <= 0 {
		opts.MaxBody = 4 << 20
	}
	ids := newSessionIDs(opts.SessionKey)
	streamable := server.NewStreamableHTTPServer(s,
		server.WithEndpointPath("/mcp"),
		server.WithSessionIdManagerResolver(ids),
		// guard checks Host itself, with AllowedHosts, for /mcp and /api alike.
		server.WithDisableLocalhostProtection(true),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
				ctx = trace.ContextWithRemoteSpanContext(ctx, sc) // the caller's traceparent (guard)
			}
			if who := jobs.SubmitterOf(r.Context()); who != "" {
				ctx = jobs.WithSubmitter(ctx, who) // guard's
			}
			if c, ok := httpauth.FromContext(r.Context()); ok {
				return httpauth.NewContext(ctx, c) // guard's
			}
			return ctx
		}),
	)
	var mcpHandler http.Handler = streamable
	if opts.Tasks != nil {
		mcpHandler = opts.Tasks.HTTP(streamable)
	}
	mcpHandler = ownSessionsOnly(ids, mcpHandler)
	if opts.MaxRequestsPerToken <= 0 {
		opts.MaxRequestsPerToken = DefaultMaxRequestsPerToken
	}
	opts.inFlight = &slots.Keyed{Max: opts.MaxRequestsPerToken}
	mux := http.NewServeMux()
	mux.Handle("/mcp", guard(mcpHandler, opts, oauth.ScopeRun))
	if opts.API != nil {
		mux.Handle("/api/", guard(opts.API, opts, oauth.ScopeJobs))
	}
	opts.Auth.MountMetadata(mux)
	for pattern, h := range opts.Extra {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if opts.Health != nil {
			if err := opts.Health(r.Context()); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": err.Error()}) // the client went away: nothing to tell it
				return
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"}) // the client went away: nothing to tell it
	})
	return mux
}

// guard applies the Host and Origin checks (DNS rebinding), opts.Auth (the
// caller must hold scope), the caller's in-flight bound and the body size
// limit.
func guard(next http.Handler, opts HTTPOptions, scope string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r, opts.AllowedHosts) {
			httperr.Write(w, http.StatusForbidden, "forbidden_host", "Host "+r.Host+" is not allowed on a loopback listener (DNS rebinding protection): connect as localhost or 127.0.0.1, or add the name to --allowed-hosts")
			return
		}
		if o := r.Header.Get("Origin"); o != "" && !originAllowed(o, opts.AllowedOrigins) {
			httperr.Write(w, http.StatusForbidden, "forbidden_origin", "Origin "+o+" is not allowed: browsers may reach this server only from localhost pages (or add the origin to --allowed-origins)")
			return
		}
		r, ok := opts.Auth.Check(w, r, scope)
		if !ok {
			return
		}
		if caller, ok := httpauth.FromContext(r.Context()); ok && opts.inFlight != nil {
			release, ok := opts.inFlight.Take(caller.Key)
			if !ok {
				w.Header().Set("Retry-After", "1")
				httperr.Write(w, http.StatusTooManyRequests, "too_many_requests", fmt.Sprintf("this token already has %d requests in flight on this front-end: wait for some to finish (use tasks or /api/jobs for many jobs at once)", opts.MaxRequestsPerToken))
				return
			}
			defer release()
		}
		r.Body = http.MaxBytesReader(w, r.Body, opts.MaxBody)
		// A caller's W3C traceparent becomes the parent of the jobs it
		// submits; one that is not exactly valid (or sent twice) is ignored.
		if tp := r.Header.Values(jobs.TraceHeader); len(tp) == 1 && jobs.ValidTraceParent(tp[0]) {
			r = r.WithContext(tracing.WithParent(r.Context(), tp[0]))
		}
		next.ServeHTTP(w, r)
	})
}

// hostAllowed applies the DNS-rebinding check: a request that reached a
// loopback address must name a loopback host (or an allowed one).
func hostAllowed(r *http.Request, extra []string) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil || !IsLoopback(local.String()) {
		return true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, e := range extra {
		if strings.EqualFold(e, host) || strings.EqualFold(e, r.Host) {
			return true
		}
	}
	return false
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

// IsLoopback reports whether a listen address binds only loopback.
func IsLoopback(addr string) bool { return cli.IsLoopback(addr) }

// TokensFile is the tokens file in its full form: bearer tokens to
// namespaces, and each namespace's policy (read by the front-end's command).
type TokensFile struct {
	Tokens map[string]string `json:"tokens"`
	// DefaultPolicy and Namespaces are raw here: their form is the front-end's
	// policy (frontend.Policy).
	DefaultPolicy json.RawMessage            `json:"default_policy,omitempty"`
	Namespaces    map[string]json.RawMessage `json:"namespaces,omitempty"`
	// MetricsTokens may read /metrics (besides loopback callers).
	MetricsTokens []string `json:"metrics_tokens,omitempty"`
	// AdminTokens act in any namespace (the console's admin view); see
	// httpauth.Config.AdminTokens.
	AdminTokens []string `json:"admin_tokens,omitempty"`
	// OAuthNamespaces maps values of the OAuth namespace claim to
	// namespaces (a value not listed is its own namespace).
	OAuthNamespaces map[string]string `json:"oauth_namespaces,omitempty"`
}

// LoadTokens reads a tokens file mapping bearer tokens to memory namespaces:
// a JSON object {"<token>": "<namespace>", ...}, the full form
// {"tokens": {...}, "default_policy": {...}, "namespaces": {"<ns>": {...}}},
// or lines of "<token> <namespace>" (blank lines and lines starting with #
// are ignored).
func LoadTokens(path string) (map[string]string, error) {
	f, err := LoadTokensFile(path)
	if err != nil {
		return nil, err
	}
	return f.Tokens, nil
}

// LoadTokensFile is LoadTokens returning the whole file.
func LoadTokensFile(path string) (*TokensFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens file: %w", err)
	}
	out := &TokensFile{Tokens: map[string]string{}}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(t, &probe); err != nil {
			return nil, fmt.Errorf("tokens file %s: not a JSON object: %w", path, err)
		}
		if raw, ok := probe["tokens"]; (ok && len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '{') || probe["oauth_namespaces"] != nil {
			dec := json.NewDecoder(bytes.NewReader(t))
			dec.DisallowUnknownFields()
			if err := dec.Decode(out); err != nil {
				return nil, fmt.Errorf("tokens file %s: want {\"tokens\": {...}, \"default_policy\": {...}, \"namespaces\": {...}, \"metrics_tokens\": [...], \"admin_tokens\": [...], \"oauth_namespaces\": {...}}: %w", path, err)
			}
		} else if err := json.Unmarshal(t, &out.Tokens); err != nil {
			return nil, fmt.Errorf("tokens file %s: not a JSON object of token to namespace: %w", path, err)
		}
	} else {
		for i, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			f := strings.Fields(line)
			if len(f) != 2 {
				return nil, fmt.Errorf("tokens file %s line %d: want \"<token> <namespace>\"", path, i+1)
			}
			out.Tokens[f[0]] = f[1]
		}
	}
	for tok, ns := range out.Tokens {
		if len(tok) < 8 {
			return nil, fmt.Errorf("tokens file %s: a token is shorter than 8 characters: use long random tokens (e.g. openssl rand -hex 24)", path)
		}
		if !httpauth.ValidNamespace(ns) {
			return nil, fmt.Errorf("tokens file %s: namespace %q must be 1-128 letters, digits, '.', '_' or '-'", path, ns)
		}
	}
	for _, tok := range out.MetricsTokens {
		if len(tok) < 8 {
			return nil, fmt.Errorf("tokens file %s: a metrics token is shorter than 8 characters", path)
		}
	}
	for _, tok := range out.AdminTokens {
		if len(tok) < 16 {
			return nil, fmt.Errorf("tokens file %s: an admin token is shorter than 16 characters: use long random tokens (e.g. openssl rand -hex 24)", path)
		}
		if _, ok := out.Tokens[tok]; ok {
			return nil, fmt.Errorf("tokens file %s: an admin token is also a namespace's token: give admins tokens of their own", path)
		}
	}
	for v, ns := range out.OAuthNamespaces {
		if !httpauth.ValidNamespace(ns) {
			return nil, fmt.Errorf("tokens file %s: oauth_namespaces maps %q to %q, which is not 1-128 letters, digits, '.', '_' or '-'", path, v, ns)
		}
	}
	if len(out.Tokens) == 0 && len(out.OAuthNamespaces) == 0 {
		return nil, fmt.Errorf("tokens file %s holds no tokens", path)
	}
	return out, nil
}
