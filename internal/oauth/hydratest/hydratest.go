// Package hydratest runs Ory Hydra, an OAuth 2.1 authorisation server that
// users deploy, for tests: built from its Go module (tools/oauth/go.mod) with
// an in-memory store, listening on loopback, with a login and consent app
// that accepts every login as the subject it is told.
package hydratest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// RequireEnv, when set, makes a Hydra that cannot be built fail the tests
// rather than skip them (CI sets it).
const RequireEnv = "MCPEXEC_REQUIRE_OAUTH"

// Build builds Hydra into dir and returns its path. It needs CGO (SQLite)
// and the module proxy or a warm module cache.
func Build(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	mod := filepath.Join(filepath.Dir(file), "..", "..", "..", "tools", "oauth")
	out := filepath.Join(dir, "hydra")
	// Bounded (a module proxy that stops answering), well above a cold build.
	cmd, cancel := testenv.Command(15*time.Minute, "go", "build", "-tags", "sqlite,sqlite_omit_load_extension", "-o", out, "github.com/ory/hydra/v2")
	defer cancel()
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build hydra in %s: %w: %s", mod, err, b)
	}
	return out, nil
}

// Hydra is a running Hydra.
type Hydra struct {
	Issuer string // public URL: the issuer, token and authorisation endpoints
	Admin  string // admin API URL
	// Subject is the subject the login app signs every user in as.
	Subject string
}

// freePort returns a loopback port nobody listens on now.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // only its port was wanted
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// Start runs the Hydra at bin until t ends.
func Start(t testing.TB, bin string) *Hydra {
	t.Helper()
	pub, adm := freePort(t), freePort(t)
	h := &Hydra{Issuer: "http://127.0.0.1:" + pub, Admin: "http://127.0.0.1:" + adm, Subject: "alice"}
	app := httptest.NewServer(h.loginConsent())
	t.Cleanup(app.Close)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", "all", "--dev", "--sqa-opt-out")
	cmd.Env = append(os.Environ(),
		"SQA_OPT_OUT=true", // no telemetry
		"DSN=memory",
		"SECRETS_SYSTEM=mcpexec-test-secret-0123456789",
		"URLS_SELF_ISSUER="+h.Issuer,
		"URLS_LOGIN="+app.URL+"/login",
		"URLS_CONSENT="+app.URL+"/consent",
		"STRATEGIES_ACCESS_TOKEN=jwt",
		"SERVE_PUBLIC_HOST=127.0.0.1", "SERVE_PUBLIC_PORT="+pub,
		"SERVE_ADMIN_HOST=127.0.0.1", "SERVE_ADMIN_PORT="+adm,
		"LOG_LEVEL=warn",
	)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start hydra: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // killed at cleanup
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("hydra's log:\n%s", logs.String())
		}
	})
	for i := 0; ; i++ {
		resp, err := http.Get(h.Admin + "/health/ready")
		if err == nil {
			_ = resp.Body.Close() // status only
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-done:
			t.Fatalf("hydra exited: %s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if i > 600 {
			t.Fatalf("hydra not ready after a minute: %s", logs.String())
		}
	}
	return h
}

// call sends JSON to Hydra and decodes its JSON answer into out.
func call(method, u string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Client registers an OAuth client (Hydra's admin API; its fields are
// Hydra's, e.g. client_id, client_secret, grant_types, scope, audience,
// redirect_uris, token_endpoint_auth_method).
func (h *Hydra) Client(t testing.TB, c map[string]any) {
	t.Helper()
	if err := call("POST", h.Admin+"/admin/clients", c, nil); err != nil {
		t.Fatal(err)
	}
}

// Lifespan sets how long id's client-credentials access tokens live.
func (h *Hydra) Lifespan(t testing.TB, id string, d time.Duration) {
	t.Helper()
	if err := call("PUT", h.Admin+"/admin/clients/"+id+"/lifespans", map[string]string{"client_credentials_grant_access_token_lifespan": d.String()}, nil); err != nil {
		t.Fatal(err)
	}
}

// Token is a token endpoint's answer.
type Token struct {
	AccessToken string `json:"access_token"`
	Scope       string `json:"scope"`
	ExpiresIn   int    `json:"expires_in"`
}

// exchange posts form to the token endpoint (as id:secret, if secret is set).
func (h *Hydra) exchange(t testing.TB, id, secret string, form url.Values) Token {
	t.Helper()
	req, _ := http.NewRequest("POST", h.Issuer+"/oauth2/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if secret != "" {
		req.SetBasicAuth(url.QueryEscape(id), url.QueryEscape(secret))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var tok Token
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &tok) != nil || tok.AccessToken == "" {
		t.Fatalf("token endpoint: %s: %s", resp.Status, b)
	}
	return tok
}

// ClientCredentials gets an access token for scope and audience.
func (h *Hydra) ClientCredentials(t testing.TB, id, secret, scope, audience string) Token {
	t.Helper()
	return h.exchange(t, id, secret, url.Values{"grant_type": {"client_credentials"}, "scope": {scope}, "audience": {audience}})
}

// AuthorizationCode signs in through the authorisation endpoint as a
// browser would (following redirects through the login and consent app,
// with cookies), with PKCE (S256), and exchanges the code as public client
// id registered with redirectURI.
func (h *Hydra) AuthorizationCode(t testing.TB, id, redirectURI, scope, audience string) Token {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // never fails
	verifier := base64.RawURLEncoding.EncodeToString(raw)
	sum := sha256.Sum256([]byte(verifier))
	state := base64.RawURLEncoding.EncodeToString(raw[:12])
	q := url.Values{"response_type": {"code"}, "client_id": {id}, "redirect_uri": {redirectURI}, "scope": {scope},
		"audience": {audience}, "state": {state}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
	jar, _ := cookiejar.New(nil) // no options: cannot fail
	var landed *url.URL
	browser := &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), redirectURI) {
			landed = req.URL
			return http.ErrUseLastResponse
		}
		if len(via) > 20 {
			return fmt.Errorf("more than 20 redirects")
		}
		return nil
	}}
	resp, err := browser.Get(h.Issuer + "/oauth2/auth?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close() // read
	if landed == nil {
		t.Fatalf("authorisation did not come back to %s: %s: %s", redirectURI, resp.Status, b)
	}
	if landed.Query().Get("state") != state || landed.Query().Get("code") == "" {
		t.Fatalf("came back as %s", landed)
	}
	return h.exchange(t, id, "", url.Values{"grant_type": {"authorization_code"}, "code": {landed.Query().Get("code")},
		"redirect_uri": {redirectURI}, "client_id": {id}, "code_verifier": {verifier}})
}

// loginConsent accepts every login as h.Subject and grants every scope and
// audience asked for.
func (h *Hydra) loginConsent() http.Handler {
	mux := http.NewServeMux()
	accept := func(w http.ResponseWriter, r *http.Request, kind, challenge string, body map[string]any) {
		var out struct {
			RedirectTo string `json:"redirect_to"`
		}
		u := h.Admin + "/admin/oauth2/auth/requests/" + kind + "/accept?" + kind + "_challenge=" + url.QueryEscape(challenge)
		if err := call("PUT", u, body, &out); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		http.Redirect(w, r, out.RedirectTo, http.StatusFound)
	}
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		accept(w, r, "login", r.URL.Query().Get("login_challenge"), map[string]any{"subject": h.Subject})
	})
	mux.HandleFunc("GET /consent", func(w http.ResponseWriter, r *http.Request) {
		ch := r.URL.Query().Get("consent_challenge")
		var req struct {
			Scope    []string `json:"requested_scope"`
			Audience []string `json:"requested_access_token_audience"`
		}
		if err := call("GET", h.Admin+"/admin/oauth2/auth/requests/consent?consent_challenge="+url.QueryEscape(ch), nil, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		accept(w, r, "consent", ch, map[string]any{"grant_scope": req.Scope, "grant_access_token_audience": req.Audience})
	})
	return mux
}
