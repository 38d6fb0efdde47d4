package httpauth

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/oauth/oauthtest"
)

// authSuite is what every Authenticator must do: a token of namespace
// "alice" with the run and jobs scopes (good), one of namespace "bob"
// (other), and tokens that must be refused.
type authSuite struct {
	auth        Authenticator
	good, other string
	refused     map[string]string
}

func runAuthSuite(t *testing.T, s authSuite) {
	t.Helper()
	ctx := context.Background()
	c, err := s.auth.Authenticate(ctx, s.good)
	if err != nil {
		t.Fatalf("good token: %v", err)
	}
	if c.Namespace != "alice" || c.Admin || !c.Can(oauth.ScopeRun) || !c.Can(oauth.ScopeJobs) || c.Can(oauth.ScopeAdmin) || c.Key == "" || strings.Contains(c.Key, s.good) {
		t.Fatalf("good token: %+v", c)
	}
	o, err := s.auth.Authenticate(ctx, s.other)
	if err != nil || o.Namespace != "bob" || o.Key == c.Key {
		t.Fatalf("other token: %+v, %v", o, err)
	}
	s.refused["empty"] = ""
	s.refused["prefix of good"] = s.good[:len(s.good)-1]
	s.refused["good with a byte more"] = s.good + "x"
	for name, tok := range s.refused {
		if c, err := s.auth.Authenticate(ctx, tok); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: got %+v, %v; want ErrUnauthenticated", name, c, err)
		}
	}
}

func TestAuthenticatorsConform(t *testing.T) {
	t.Run("StaticTokens", func(t *testing.T) {
		runAuthSuite(t, authSuite{
			auth: StaticTokens{Tokens: map[string]string{"alice-token-1": "alice", "bob-token-1": "bob"}, AdminTokens: []string{"admin-token-0123456789"}},
			good: "alice-token-1", other: "bob-token-1",
			refused: map[string]string{"unknown": "carol-token-1"},
		})
	})
	t.Run("OAuthTokens", func(t *testing.T) {
		is := oauthtest.NewIssuer(t)
		const aud = "http://127.0.0.1:1/mcp"
		v, err := oauth.New(oauth.Config{Issuers: []string{is.URL}, Audience: aud})
		if err != nil {
			t.Fatal(err)
		}
		expired := is.Claims(aud, "alice", "mcpexec:run mcpexec:jobs")
		expired["exp"] = time.Now().Add(-time.Hour).Unix()
		runAuthSuite(t, authSuite{
			auth:  OAuthTokens{V: v},
			good:  is.Mint(t, is.Claims(aud, "alice", "mcpexec:run mcpexec:jobs")),
			other: is.Mint(t, is.Claims(aud, "bob", "mcpexec:run")),
			refused: map[string]string{
				"expired":        is.Mint(t, expired),
				"other audience": is.Mint(t, is.Claims("http://127.0.0.1:2/mcp", "alice", "mcpexec:run")),
				"unknown key":    oauthtest.Sign(t, oauthtest.NewKey(t, "test-key"), is.Claims(aud, "alice", "mcpexec:run")),
				"alg none":       oauthtest.Unsigned(t, is.Claims(aud, "alice", "mcpexec:run")),
			},
		})
	})
}

// answer is what a request got: status, challenge, error body, and the
// caller the handler behind the check saw.
type answer struct {
	status    int
	challenge string
	code, msg string
	caller    Caller
	seen      bool
}

// serve sends h one request from remote with token (none when "") and
// the namespace header ns (none when "").
func serve(t *testing.T, mw func(http.Handler) http.Handler, remote, token, ns string) answer {
	t.Helper()
	var a answer
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.caller, a.seen = FromContext(r.Context())
		if a.seen && jobs.SubmitterOf(r.Context()) != a.caller.Who && a.caller.Who != "" && !strings.HasPrefix(a.caller.Who, "metrics-token:") {
			t.Errorf("submitter %q, caller %q", jobs.SubmitterOf(r.Context()), a.caller.Who)
		}
		w.WriteHeader(http.StatusTeapot)
	})
	req := httptest.NewRequest(http.MethodPost, "/x", nil)
	req.RemoteAddr = remote
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ns != "" {
		req.Header.Set(NamespaceHeader, ns)
	}
	rec := httptest.NewRecorder()
	mw(next).ServeHTTP(rec, req)
	a.status, a.challenge = rec.Code, rec.Header().Get("WWW-Authenticate")
	if rec.Code != http.StatusTeapot {
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("error body %q: %v", rec.Body.String(), err)
		}
		a.code, a.msg = body.Error.Code, body.Error.Message
	}
	return a
}

const (
	loopback = "127.0.0.1:4000"
	remote   = "203.0.113.7:4000"
	tenant   = "tenant-token-1"
	admin    = "admin-token-0123456789"
	metrics  = "metrics-token-1"
)

// TestAuthAnswers pins what each way of calling gets: the status, the
// WWW-Authenticate challenge and the error body, and the caller the
// handler sees. The texts are the front-end's documented answers: clients
// and operators read them.
func TestAuthAnswers(t *testing.T) {
	t.Parallel()
	auth := New(Config{Tokens: map[string]string{tenant: "alice"}, AdminTokens: []string{admin}, MetricsTokens: []string{metrics}})
	run := func(next http.Handler) http.Handler { return auth.Require(oauth.ScopeRun, next) }
	met := auth.Metrics
	const need = "a valid bearer token is required: send Authorization: Bearer <token>"
	const metricsNeed = "/metrics from beyond loopback needs a metrics token: list it under metrics_tokens in the tokens file and send Authorization: Bearer <token>"
	for _, tc := range []struct {
		name              string
		metrics           bool // the /metrics route, else the MCP one
		remote, token, ns string
		status            int
		challenge, msg    string
		ns2               string // the caller's namespace, when it passes
		admin             bool
	}{
		{"missing token", false, remote, "", "", 401, `Bearer realm="mcpexec"`, need, "", false},
		{"missing token from loopback", false, loopback, "", "", 401, `Bearer realm="mcpexec"`, need, "", false},
		{"wrong token", false, remote, "nope-token-1", "", 401, `Bearer realm="mcpexec"`, need + " (unknown token)", "", false},
		{"tenant", false, remote, tenant, "", 418, "", "", "alice", false},
		{"tenant's namespace header is ignored", false, remote, tenant, "bob", 418, "", "", "alice", false},
		{"admin", false, remote, admin, "", 418, "", "", jobs.DefaultNamespace, true},
		{"admin names a namespace", false, remote, admin, "bob", 418, "", "", "bob", true},
		{"admin names a bad namespace", false, remote, admin, "b/ob", 400, "", NamespaceHeader + " must be 1-128 letters, digits, '.', '_' or '-'", "", false},
		{"metrics token on MCP", false, remote, metrics, "", 401, `Bearer realm="mcpexec"`, need + " (unknown token)", "", false},
		{"metrics from loopback", true, loopback, "", "", 418, "", "", "", false},
		{"metrics token", true, remote, metrics, "", 418, "", "", "", false},
		{"metrics without token", true, remote, "", "", 401, `Bearer realm="mcpexec-metrics"`, metricsNeed, "", false},
		{"metrics with a tenant token", true, remote, tenant, "", 401, `Bearer realm="mcpexec-metrics"`, metricsNeed, "", false},
		{"metrics with an admin token", true, remote, admin, "", 401, `Bearer realm="mcpexec-metrics"`, metricsNeed, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := run
			if tc.metrics {
				mw = met
			}
			a := serve(t, mw, tc.remote, tc.token, tc.ns)
			if a.status != tc.status || a.challenge != tc.challenge || a.msg != tc.msg {
				t.Fatalf("got %d %q %q, want %d %q %q", a.status, a.challenge, a.msg, tc.status, tc.challenge, tc.msg)
			}
			switch {
			case tc.status == 401 && a.code != "unauthorized", tc.status == 400 && a.code != "bad_namespace":
				t.Fatalf("error code %q", a.code)
			case tc.status == 418 && !tc.metrics && (!a.seen || a.caller.Namespace != tc.ns2 || a.caller.Admin != tc.admin):
				t.Fatalf("caller %+v (seen %v), want namespace %q admin %v", a.caller, a.seen, tc.ns2, tc.admin)
			case tc.name == "metrics token" && (!a.seen || !a.caller.Can(ScopeMetrics) || a.caller.Can(oauth.ScopeRun) || a.caller.Can(oauth.ScopeJobs)):
				t.Fatalf("metrics caller %+v", a.caller)
			}
		})
	}
	// Scope: a caller without it gets 403 insufficient_scope.
	jobsOnly := New(Config{OAuth: nil, Tokens: map[string]string{tenant: "alice"}})
	adminOnly := func(next http.Handler) http.Handler { return jobsOnly.Require(oauth.ScopeAdmin, next) }
	a := serve(t, adminOnly, remote, tenant, "")
	if a.status != 403 || a.challenge != `Bearer realm="mcpexec", error="insufficient_scope", scope="mcpexec:admin"` ||
		a.code != "insufficient_scope" || a.msg != "this token lacks scope mcpexec:admin: ask the authorisation server for it" {
		t.Fatalf("lacking scope: %+v", a)
	}
}

// TestNoAuthIsOpen: without tokens or OAuth the MCP and API routes are open
// (loopback only: the front-end refuses to listen elsewhere so) and carry
// no caller; /metrics still needs loopback or a metrics token.
func TestNoAuthIsOpen(t *testing.T) {
	t.Parallel()
	for _, auth := range []*Auth{nil, New(Config{})} {
		if auth.Enabled() {
			t.Fatal("an Auth without tokens is enabled")
		}
		a := serve(t, func(next http.Handler) http.Handler { return auth.Require(oauth.ScopeRun, next) }, remote, "whatever", "bob")
		if a.status != 418 || a.seen {
			t.Fatalf("open route: %+v", a)
		}
	}
	a := serve(t, New(Config{}).Metrics, remote, "", "")
	if a.status != 401 {
		t.Fatalf("metrics beyond loopback without tokens: %+v", a)
	}
}

// TestOAuthChallenges: with OAuth configured, refusals name the resource
// metadata and the scope needed, and the metadata is mounted.
func TestOAuthChallenges(t *testing.T) {
	t.Parallel()
	is := oauthtest.NewIssuer(t)
	const aud = "http://127.0.0.1:1/mcp"
	v, err := oauth.New(oauth.Config{Issuers: []string{is.URL}, Audience: aud})
	if err != nil {
		t.Fatal(err)
	}
	auth := New(Config{Tokens: map[string]string{tenant: "alice"}, OAuth: v})
	jobsRoute := func(next http.Handler) http.Handler { return auth.Require(oauth.ScopeJobs, next) }
	meta := `resource_metadata="http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp"`
	a := serve(t, jobsRoute, remote, "", "")
	if a.status != 401 || !strings.Contains(a.challenge, meta) || strings.Contains(a.challenge, "error=") || !strings.Contains(a.challenge, `scope="mcpexec:jobs"`) ||
		!strings.HasPrefix(a.msg, "a valid bearer token is required: send Authorization: Bearer <token>, a token of the tokens file or an access token from "+is.URL+" for "+aud) {
		t.Fatalf("no token: %+v", a)
	}
	a = serve(t, jobsRoute, remote, is.Mint(t, is.Claims(aud, "carol", "mcpexec:run")), "")
	if a.status != 403 || !strings.Contains(a.challenge, `error="insufficient_scope"`) || !strings.Contains(a.challenge, meta) {
		t.Fatalf("lacking scope: %+v", a)
	}
	a = serve(t, jobsRoute, remote, is.Mint(t, is.Claims(aud, "carol", "mcpexec:jobs")), "alice")
	if a.status != 418 || a.caller.Namespace != "carol" || a.caller.Admin || !strings.HasPrefix(a.caller.Who, "oauth:") {
		t.Fatalf("OAuth tenant: %+v", a)
	}
	a = serve(t, auth.Metrics, remote, is.Mint(t, is.Claims(aud, "root", "mcpexec:admin")), "")
	if a.status != 401 {
		t.Fatalf("an OAuth admin read metrics: %+v", a)
	}
	mux := http.NewServeMux()
	auth.MountMetadata(mux)
	for _, p := range oauth.MetadataPaths(aud) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		var m oauth.Metadata
		if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || m.Resource != aud {
			t.Fatalf("%s: %d %q", p, rec.Code, rec.Body.String())
		}
	}
}
