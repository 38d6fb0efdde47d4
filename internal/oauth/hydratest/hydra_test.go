package hydratest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/oauth/hydratest"
	"github.com/mcpexec/mcpexec/internal/oauth/oauthtest"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

var (
	hydraBin string // built by TestMain
	skipWhy  string // why Hydra is not there, when it is not
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mcpexec-hydra-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if hydraBin, err = hydratest.Build(dir); err != nil {
		if os.Getenv(hydratest.RequireEnv) != "" {
			fmt.Fprintf(os.Stderr, "%s is set, and Hydra cannot be built: %v\n", hydratest.RequireEnv, err)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
		skipWhy = err.Error()
	}
	code := 0
	func() {
		defer func() { _ = os.RemoveAll(dir) }() // a temp dir
		goleak.VerifyTestMain(exitCode{m, &code})
	}()
	os.Exit(code)
}

// exitCode lets TestMain clean up after goleak's verdict.
type exitCode struct {
	m    *testing.M
	code *int
}

func (e exitCode) Run() int { *e.code = e.m.Run(); return *e.code }

// fixture is Hydra, a front-end stack on the process runtime whose HTTP
// surface trusts Hydra, and the MCP audience.
type fixture struct {
	h   *hydratest.Hydra
	url string // the front-end's base URL
	aud string // its /mcp: the audience
}

func setup(t *testing.T) *fixture {
	t.Helper()
	if skipWhy != "" {
		t.Skipf("Hydra cannot be built (set %s to fail instead): %s", hydratest.RequireEnv, skipWhy)
	}
	h := hydratest.Start(t, hydraBin)
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	fe := testutil.Frontend(t, b, "fe1")
	hs := httptest.NewUnstartedServer(nil)
	f := &fixture{h: h, url: "http://" + hs.Listener.Addr().String()}
	f.aud = f.url + "/mcp"
	v, err := oauth.New(oauth.Config{Issuers: []string{h.Issuer}, Audience: f.aud, Leeway: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpserver.New(fe, mcpserver.Options{Namespace: httpauth.Namespace})
	hs.Config.Handler = mcpserver.Handler(srv, mcpserver.HTTPOptions{Health: fe.Health, API: jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace}), Auth: httpauth.New(httpauth.Config{OAuth: v, Tokens: map[string]string{"static-token-1": "static"}})})
	hs.Start()
	t.Cleanup(hs.Close)
	return f
}

// service registers a client-credentials client whose id is its namespace.
func (f *fixture) service(t *testing.T, id, scope string, audience ...string) {
	t.Helper()
	if len(audience) == 0 {
		audience = []string{f.aud}
	}
	f.h.Client(t, map[string]any{"client_id": id, "client_secret": id + "-secret-0123456789", "grant_types": []string{"client_credentials"},
		"scope": scope, "audience": audience, "token_endpoint_auth_method": "client_secret_basic"})
}

func (f *fixture) token(t *testing.T, id, scope string) string {
	t.Helper()
	return f.h.ClientCredentials(t, id, id+"-secret-0123456789", scope, f.aud).AccessToken
}

// mcpClient is the Go MCP client the other tests use, sending token.
func (f *fixture) mcpClient(t *testing.T, token string) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient(f.aud, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}),
		transport.WithHTTPTimeout(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // the test is over
	testutil.StartMCP(t, context.Background(), c, "oauth-test")
	return c
}

// get sends a request with token and returns status, challenge and body.
func (f *fixture) do(t *testing.T, method, path, token string) (int, string, string) {
	t.Helper()
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	}
	req, _ := http.NewRequest(method, f.url+path, body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// TestClientCredentialsRunPython: a service gets a token from Hydra with
// client credentials and runs code through /mcp; another namespace's token
// cannot see its jobs; static tokens keep working beside OAuth.
func TestClientCredentialsRunPython(t *testing.T) {
	f := setup(t)
	f.service(t, "team-a", "mcpexec:run mcpexec:jobs")
	f.service(t, "team-b", "mcpexec:run mcpexec:jobs")
	a := f.mcpClient(t, f.token(t, "team-a", "mcpexec:run mcpexec:jobs"))
	out, st := testutil.RunCode(t, a, `save_memory("who", "a"); print(6 * 7)`)
	if st.Status != "success" || !strings.Contains(out, "42") || st.JobID == "" {
		t.Fatalf("run_python as team-a: %s %s", st.Status, out)
	}
	b := f.mcpClient(t, f.token(t, "team-b", "mcpexec:run"))
	if got := testutil.MustRunCode(t, b, `print(load_memory("who"))`); got != "None" {
		t.Fatalf("team-b reads team-a's memory: %q", got)
	}
	bJobs := f.token(t, "team-b", "mcpexec:jobs")
	if status, _, body := f.do(t, "GET", "/api/jobs/"+st.JobID, bJobs); status != http.StatusNotFound {
		t.Fatalf("team-b reads team-a's job: %d %s", status, body)
	}
	if status, _, body := f.do(t, "GET", "/api/jobs", bJobs); status != 200 || strings.Contains(body, st.JobID) {
		t.Fatalf("team-b's job list: %d %s", status, body)
	}
	aJobs := f.token(t, "team-a", "mcpexec:jobs")
	if status, _, body := f.do(t, "GET", "/api/jobs/"+st.JobID, aJobs); status != 200 {
		t.Fatalf("team-a reads its job: %d %s", status, body)
	}
	if status, _, body := f.do(t, "GET", "/api/jobs", "static-token-1"); status != 200 || strings.Contains(body, st.JobID) {
		t.Fatalf("static token: %d %s", status, body)
	}
}

// TestAuthorizationCodePKCE: a user signs in through Hydra's authorisation
// endpoint (login and consent driven headlessly) and the token runs code in
// the namespace of the user's subject.
func TestAuthorizationCodePKCE(t *testing.T) {
	f := setup(t)
	f.h.Subject = "user-alice"
	redirect := "http://127.0.0.1:1/callback" // never fetched: the flow stops at it
	f.h.Client(t, map[string]any{"client_id": "agent-app", "grant_types": []string{"authorization_code", "refresh_token"},
		"response_types": []string{"code"}, "redirect_uris": []string{redirect}, "scope": "mcpexec:run mcpexec:jobs",
		"audience": []string{f.aud}, "token_endpoint_auth_method": "none"})
	tok := f.h.AuthorizationCode(t, "agent-app", redirect, "mcpexec:run", f.aud)
	c := f.mcpClient(t, tok.AccessToken)
	if got := testutil.MustRunCode(t, c, `save_memory("k", 1); print("hi")`); got != "hi" {
		t.Fatalf("run_python: %q", got)
	}
	// The namespace is the subject: a service named like it shares it, one named otherwise does not.
	f.service(t, "user-alice", "mcpexec:run")
	if got := testutil.MustRunCode(t, f.mcpClient(t, f.token(t, "user-alice", "mcpexec:run")), `print(load_memory("k"))`); got != "1" {
		t.Fatalf("the subject's namespace: %q", got)
	}
}

// TestRefusals attacks with tokens that must not pass, each refused with
// the status and challenge a client can act on.
func TestRefusals(t *testing.T) {
	f := setup(t)
	f.service(t, "svc", "mcpexec:run mcpexec:jobs")
	f.service(t, "narrow", "mcpexec:jobs")
	f.service(t, "elsewhere", "mcpexec:run", "https://other.example.test/mcp")
	f.service(t, "brief", "mcpexec:run")
	f.h.Lifespan(t, "brief", time.Second)

	good := f.token(t, "svc", "mcpexec:run")
	var claims map[string]any
	if err := json.Unmarshal(payload(t, good), &claims); err != nil {
		t.Fatal(err)
	}
	kid := header(t, good).KeyID
	forged := oauthtest.Sign(t, oauthtest.NewKey(t, kid), claims) // same claims and kid, our key
	otherAud := f.h.ClientCredentials(t, "elsewhere", "elsewhere-secret-0123456789", "mcpexec:run", "https://other.example.test/mcp").AccessToken
	brief := f.h.ClientCredentials(t, "brief", "brief-secret-0123456789", "mcpexec:run", f.aud)
	var bc map[string]any
	if err := json.Unmarshal(payload(t, brief.AccessToken), &bc); err != nil {
		t.Fatal(err)
	}
	for exp := time.Unix(int64(bc["exp"].(float64)), 0); !time.Now().After(exp.Add(time.Second)); {
		time.Sleep(100 * time.Millisecond) // until the token is past its exp: no assertion on time
	}
	meta := `resource_metadata="` + f.url + `/.well-known/oauth-protected-resource/mcp"`
	for _, tc := range []struct {
		name, token string
		status      int
		challenge   []string
	}{
		{"no token", "", 401, []string{meta, `scope="mcpexec:run"`}},
		{"expired", brief.AccessToken, 401, []string{meta, `error="invalid_token"`, "expired"}},
		{"another audience", otherAud, 401, []string{meta, `error="invalid_token"`, "another audience"}},
		{"unknown key", forged, 401, []string{meta, `error="invalid_token"`, "bad signature"}},
		{"alg none", oauthtest.Unsigned(t, claims), 401, []string{meta, `error="invalid_token"`, "accepted algorithm"}},
		{"scope lacks run", f.token(t, "narrow", "mcpexec:jobs"), 403, []string{meta, `error="insufficient_scope"`, `scope="mcpexec:run"`}},
		{"good", good, 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, ch, body := f.do(t, "POST", "/mcp", tc.token)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			for _, part := range tc.challenge {
				if !strings.HasPrefix(ch, "Bearer ") || !strings.Contains(ch, part) {
					t.Errorf("WWW-Authenticate %q lacks %q", ch, part)
				}
			}
		})
	}
	// The metadata a client finds from the challenge names Hydra.
	status, _, body := f.do(t, "GET", "/.well-known/oauth-protected-resource/mcp", "")
	var m oauth.Metadata
	if status != 200 || json.Unmarshal([]byte(body), &m) != nil || m.Resource != f.aud || len(m.AuthorizationServers) != 1 || m.AuthorizationServers[0] != f.h.Issuer {
		t.Fatalf("metadata: %d %s", status, body)
	}
}

func header(t *testing.T, raw string) jose.Header {
	t.Helper()
	sig, err := jose.ParseSignedCompact(raw, oauth.Algorithms)
	if err != nil {
		t.Fatal(err)
	}
	return sig.Signatures[0].Header
}

func payload(t *testing.T, raw string) []byte {
	t.Helper()
	sig, err := jose.ParseSignedCompact(raw, oauth.Algorithms)
	if err != nil {
		t.Fatal(err)
	}
	return sig.UnsafePayloadWithoutVerification()
}

// TestOfficialSDKOAuthClient: the official TypeScript SDK's OAuth client
// starts without a token, follows the challenge to the metadata and to
// Hydra, gets a token with client credentials and runs code.
func TestOfficialSDKOAuthClient(t *testing.T) {
	f := setup(t)
	path := testutil.NodeScript(t, "oauth_client.mjs")
	f.service(t, "sdk-svc", "mcpexec:run")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "node", path, f.aud, "sdk-svc", "sdk-svc-secret-0123456789", f.aud).CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r struct {
		Text       string `json:"text"`
		IsError    bool   `json:"isError"`
		Challenged bool   `json:"challenged"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("client output %s: %v", out, err)
	}
	if r.IsError || !strings.Contains(r.Text, "42") || !r.Challenged {
		t.Fatalf("SDK client: %+v (%s)", r, out)
	}
}
