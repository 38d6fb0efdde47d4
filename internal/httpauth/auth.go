package httpauth

import (
	"net"
	"net/http"
	"strings"

	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
)

// Config is what an Auth accepts. With no tokens and no OAuth the MCP and
// API routes are open, which is allowed only on loopback listeners (the
// caller enforces that); /metrics always needs loopback or a metrics token.
type Config struct {
	// Tokens maps bearer tokens to namespaces.
	Tokens map[string]string
	// AdminTokens may act in every namespace: the namespace of a request
	// is its NamespaceHeader (jobs.DefaultNamespace without one).
	// Configured only explicitly (admin_tokens in the tokens file); none
	// means nobody sees another namespace.
	AdminTokens []string
	// MetricsTokens may read /metrics from beyond loopback, and nothing
	// else.
	MetricsTokens []string
	// OAuth, when set, also accepts its issuers' access tokens (beside
	// Tokens and AdminTokens), and Auth serves its protected resource
	// metadata (MountMetadata).
	OAuth *oauth.Validator
}

// Auth authenticates HTTP requests. Build it once, where the HTTP server is
// built, and put it in front of every route that needs a caller (Check,
// Require, Metrics).
type Auth struct {
	oauth *oauth.Validator
	// ways are the authenticators of the MCP and API routes, static tokens
	// first; none: those routes are open.
	ways []Authenticator
	// metrics is the authenticator of /metrics beyond loopback.
	metrics Authenticator
}

// New returns the Auth of cfg.
func New(cfg Config) *Auth {
	a := &Auth{oauth: cfg.OAuth, metrics: StaticTokens{MetricsTokens: cfg.MetricsTokens}}
	if len(cfg.Tokens) > 0 || len(cfg.AdminTokens) > 0 {
		a.ways = append(a.ways, StaticTokens{Tokens: cfg.Tokens, AdminTokens: cfg.AdminTokens})
	}
	if cfg.OAuth != nil {
		a.ways = append(a.ways, OAuthTokens{V: cfg.OAuth})
	}
	return a
}

// Enabled reports whether the MCP and API routes need a caller (some
// tokens or OAuth are configured).
func (a *Auth) Enabled() bool { return a != nil && len(a.ways) > 0 }

// bearer is the request's bearer token, or "" when it sends none.
func bearer(r *http.Request) string {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(tok)
}

// Check authenticates r for a route that needs scope. It returns r with
// the caller in its context (FromContext) and the caller's name as its
// jobs' submitter, or, having answered the refusal itself (401 with the
// challenge that says how to get a token, 403 insufficient_scope, 400 for
// an admin's malformed NamespaceHeader), false. Without authentication
// configured it returns r as it is.
func (a *Auth) Check(w http.ResponseWriter, r *http.Request, scope string) (*http.Request, bool) {
	if !a.Enabled() {
		return r, true
	}
	tok := bearer(r)
	caller, err := authenticate(r.Context(), a.ways, tok)
	if err != nil {
		a.unauthorized(w, tok != "", reason(err), scope)
		return nil, false
	}
	if !caller.Can(scope) {
		a.forbiddenScope(w, scope)
		return nil, false
	}
	if caller.Admin {
		caller.Namespace = jobs.DefaultNamespace
		if h := r.Header.Get(NamespaceHeader); h != "" {
			if !ValidNamespace(h) {
				httperr.Write(w, http.StatusBadRequest, "bad_namespace", NamespaceHeader+" must be 1-128 letters, digits, '.', '_' or '-'")
				return nil, false
			}
			caller.Namespace = h
		}
	}
	return r.WithContext(jobs.WithSubmitter(NewContext(r.Context(), caller), caller.Who)), true
}

// Require is Check in front of next.
func (a *Auth) Require(scope string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := a.Check(w, r, scope); ok {
			next.ServeHTTP(w, r)
		}
	})
}

// Metrics serves next (/metrics) to loopback callers and, from elsewhere,
// only to callers with a metrics token: metric names and label values
// describe the fleet's tenants and load.
func (a *Auth) Metrics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
				next.ServeHTTP(w, r)
				return
			}
		}
		caller, err := authenticate(r.Context(), []Authenticator{a.metrics}, bearer(r))
		if err != nil || !caller.Can(ScopeMetrics) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcpexec-metrics"`)
			httperr.Write(w, http.StatusUnauthorized, "unauthorized", "/metrics from beyond loopback needs a metrics token: list it under metrics_tokens in the tokens file and send Authorization: Bearer <token>")
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), caller)))
	})
}

// MountMetadata serves the OAuth protected resource metadata (RFC 9728) on
// mux when OAuth is configured: public, at the plain well-known path and
// the one suffixed with the resource's path.
func (a *Auth) MountMetadata(mux *http.ServeMux) {
	if a == nil || a.oauth == nil {
		return
	}
	for _, p := range oauth.MetadataPaths(a.oauth.Config().Audience) {
		mux.Handle(p, a.oauth.MetadataHandler())
	}
}

// unauthorized answers 401 with the challenge that tells a client how to
// get a token: with OAuth, the resource metadata and the scope needed.
func (a *Auth) unauthorized(w http.ResponseWriter, sent bool, why, scope string) {
	msg := "a valid bearer token is required: send Authorization: Bearer <token>"
	if !sent {
		why = ""
	}
	if a.oauth != nil {
		code := ""
		if sent {
			code = "invalid_token"
		}
		w.Header().Set("WWW-Authenticate", a.oauth.Challenge(code, why, scope))
		msg = "a valid bearer token is required: send Authorization: Bearer <token>, a token of the tokens file or an access token from " + strings.Join(a.oauth.Config().Issuers, " or ") + " for " + a.oauth.Config().Audience
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="mcpexec"`)
	}
	if why != "" {
		msg += " (" + why + ")"
	}
	httperr.Write(w, http.StatusUnauthorized, "unauthorized", msg)
}

// forbiddenScope answers 403 insufficient_scope (RFC 6750 §3.1).
func (a *Auth) forbiddenScope(w http.ResponseWriter, scope string) {
	if a.oauth != nil {
		w.Header().Set("WWW-Authenticate", a.oauth.Challenge("insufficient_scope", "this needs scope "+scope, scope))
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="mcpexec", error="insufficient_scope", scope="`+scope+`"`)
	}
	httperr.Write(w, http.StatusForbidden, "insufficient_scope", "this token lacks scope "+scope+": ask the authorisation server for it")
}
