package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/oauth/oauthtest"
)

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
		got <- seen{httpauth.Namespace(r.Context()), httpauth.IsAdmin(r.Context())}
	})
	hs := httptest.NewUnstartedServer(nil)
	aud := "http://" + hs.Listener.Addr().String() + "/mcp"
	v, err := oauth.New(oauth.Config{Issuers: []string{is.URL}, Audience: aud})
	if err != nil {
		t.Fatal(err)
	}
	opts := HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tenant-token-1": "alice"}, OAuth: v})}
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
				req.Header.Set(httpauth.NamespaceHeader, tc.header)
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
