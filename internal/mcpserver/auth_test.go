package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

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

// TestOAuthBesideStaticTokens: on one handler, static tokens keep working,
// OAuth tokens work for the scopes they hold, refusals carry the RFC 6750
// challenge naming the RFC 9728 metadata, which is served.
func TestOAuthBesideStaticTokens(t *testing.T) {
	is := oauthtest.NewIssuer(t)
	type seen struct {
		ns    string
		admin bool
	}
	got := make(chan seen, 1)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{NamespaceFromContext(r.Context()), IsAdmin(r.Context())}
	})
	opts := HTTPOptions{Tokens: map[string]string{"tenant-token-1": "alice"}, API: api}
	hs := httptest.NewUnstartedServer(nil)
	aud := "http://" + hs.Listener.Addr().String() + "/mcp"
	v, err := oauth.New(oauth.Config{Issuers: []string{is.URL}, Audience: aud})
	if err != nil {
		t.Fatal(err)
	}
	opts.OAuth = v
	hs.Config.Handler = Handler(server.NewMCPServer("t", "0"), opts)
	hs.Start()
	defer hs.Close()
	meta := `resource_metadata="http://` + hs.Listener.Addr().String() + `/.well-known/oauth-protected-resource/mcp"`
	expired := is.Claims(aud, "carol", "mcpexec:jobs")
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	for _, tc := range []struct {
		name, path, token, header string
		status                    int
		challenge                 []string // parts of WWW-Authenticate
		want                      seen
	}{
		{"Static", "/api/x", "tenant-token-1", "", 200, nil, seen{"alice", false}},
		{"OAuthJobs", "/api/x", is.Mint(t, is.Claims(aud, "carol", "mcpexec:jobs")), "", 200, nil, seen{"carol", false}},
		{"OAuthIgnoresHeader", "/api/x", is.Mint(t, is.Claims(aud, "carol", "mcpexec:jobs")), "alice", 200, nil, seen{"carol", false}},
		{"OAuthAdmin", "/api/x", is.Mint(t, is.Claims(aud, "root", "mcpexec:admin")), "alice", 200, nil, seen{"alice", true}},
		{"NoToken", "/mcp", "", "", 401, []string{meta, `scope="mcpexec:run"`}, seen{}},
		{"UnknownStatic", "/api/x", "nope-token-1", "", 401, []string{meta, `error="invalid_token"`, "unknown token"}, seen{}},
		{"Expired", "/api/x", is.Mint(t, expired), "", 401, []string{meta, `error="invalid_token"`, `expired`, `scope="mcpexec:jobs"`}, seen{}},
		{"OtherAudience", "/mcp", is.Mint(t, is.Claims("https://elsewhere/mcp", "carol", "mcpexec:run")), "", 401, []string{meta, `error="invalid_token"`, "another audience"}, seen{}},
		{"UnknownKey", "/mcp", oauthtest.Sign(t, oauthtest.NewKey(t, "test-key"), is.Claims(aud, "carol", "mcpexec:run")), "", 401, []string{meta, `error="invalid_token"`}, seen{}},
		{"AlgNone", "/mcp", oauthtest.Unsigned(t, is.Claims(aud, "carol", "mcpexec:run")), "", 401, []string{meta, `error="invalid_token"`}, seen{}},
		{"LacksRun", "/mcp", is.Mint(t, is.Claims(aud, "carol", "mcpexec:jobs")), "", 403, []string{meta, `error="insufficient_scope"`, `scope="mcpexec:run"`}, seen{}},
		{"LacksJobs", "/api/x", is.Mint(t, is.Claims(aud, "carol", "mcpexec:run")), "", 403, []string{meta, `error="insufficient_scope"`, `scope="mcpexec:jobs"`}, seen{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), "POST", hs.URL+tc.path, strings.NewReader(initialize))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if tc.header != "" {
				req.Header.Set(NamespaceHeader, tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close() // nothing to read
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			ch := resp.Header.Get("WWW-Authenticate")
			for _, part := range tc.challenge {
				if !strings.HasPrefix(ch, "Bearer ") || !strings.Contains(ch, part) {
					t.Errorf("WWW-Authenticate %q lacks %q", ch, part)
				}
			}
			if tc.status == 200 {
				if s := <-got; s != tc.want {
					t.Errorf("saw %+v, want %+v", s, tc.want)
				}
			}
		})
	}
	for _, p := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		var m oauth.Metadata
		err = json.NewDecoder(resp.Body).Decode(&m)
		_ = resp.Body.Close() // read
		if err != nil || m.Resource != aud || len(m.AuthorizationServers) != 1 || m.AuthorizationServers[0] != is.URL {
			t.Fatalf("%s: %+v, %v", p, m, err)
		}
	}
}

func TestTokensFileOAuthNamespaces(t *testing.T) {
	dir := t.TempDir()
	for body, ok := range map[string]bool{
		`{"oauth_namespaces": {"auth0|64f": "alice"}}`:                              true,
		`{"tokens": {"tenant-token-1": "a"}, "oauth_namespaces": {"svc": "batch"}}`: true,
		`{"oauth_namespaces": {"svc": "a/b"}}`:                                      false,
		`{"oauth_namespaces": {}}`:                                                  false,
	} {
		p := filepath.Join(dir, "tokens.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := LoadTokensFile(p)
		if (err == nil) != ok {
			t.Errorf("%s: %v", body, err)
		}
		if ok && err == nil && len(f.OAuthNamespaces) != 1 {
			t.Errorf("%s: read %+v", body, f.OAuthNamespaces)
		}
	}
}
