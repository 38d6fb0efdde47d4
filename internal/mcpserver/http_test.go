package mcpserver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

func TestGuardHostOriginTokens(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	var sawNS string
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawNS = httpauth.Namespace(r.Context())
		w.WriteHeader(http.StatusTeapot)
	})
	hs := httptest.NewServer(Handler(s, HTTPOptions{API: api, AllowedHosts: []string{"proxy.local"}, MaxBody: 1024, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"secret-token-1": "alice"}})}))
	defer hs.Close()
	cases := []struct {
		name   string
		host   string
		origin string
		auth   string
		body   string
		status int
	}{
		{"DNSRebindingHost", "evil.example:80", "", "Bearer secret-token-1", "", http.StatusForbidden},
		{"AllowedHost", "proxy.local", "", "Bearer secret-token-1", "", http.StatusTeapot},
		{"ForeignOrigin", "", "http://evil.example", "Bearer secret-token-1", "", http.StatusForbidden},
		{"LocalOrigin", "", "http://localhost:3000", "Bearer secret-token-1", "", http.StatusTeapot},
		{"NoToken", "", "", "", "", http.StatusUnauthorized},
		{"WrongToken", "", "", "Bearer nope", "", http.StatusUnauthorized},
		{"Token", "", "", "Bearer secret-token-1", "", http.StatusTeapot},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), "POST", hs.URL+"/api/x", strings.NewReader(tc.body))
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close() // read or abandoned: nothing to report
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	if sawNS != "alice" {
		t.Fatalf("namespace %q", sawNS)
	}
	// The body limit applies on /mcp.
	req, _ := http.NewRequest("POST", hs.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"`+strings.Repeat("a", 4096)+`"}}`))
	req.Header.Set("Authorization", "Bearer secret-token-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // read or abandoned: nothing to report
	if resp.StatusCode < 400 {
		t.Fatalf("oversized body accepted: %d", resp.StatusCode)
	}
}

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := LoadTokens(write("a.json", `{"token-aaaaaaaa": "alice", "token-bbbbbbbb": "bob"}`))
	if err != nil || got["token-aaaaaaaa"] != "alice" || len(got) != 2 {
		t.Fatalf("json: %v %v", got, err)
	}
	got, err = LoadTokens(write("b.txt", "# comment\n\ntoken-cccccccc carol\n"))
	if err != nil || got["token-cccccccc"] != "carol" {
		t.Fatalf("lines: %v %v", got, err)
	}
	for name, body := range map[string]string{"short": "abc x\n", "badns": "token-dddddddd a/b\n", "fields": "one two three\n", "empty": "# nothing\n"} {
		if _, err := LoadTokens(write(name, body)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestTOON(t *testing.T) {
	st := Structured{Status: "error", Summary: "error: boom", ExitCode: 1, Stdout: []string{"a, b", "plain", "42", ""},
		Stderr: []string{}, Error: "ValueError: x", TimeoutSeconds: 30, JobID: "01J"}
	want := `status: error
summary: "error: boom"
exitCode: 1
stdout[4]: "a, b",plain,"42",""
stderr[0]:
error: "ValueError: x"
timeoutSeconds: 30
jobId: 01J`
	if got := TOON(st); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestToolDescriptionStaysSmall keeps the one tool's description near 200 tokens
// (about 4 bytes a token) however many servers there are.
func TestToolDescriptionStaysSmall(t *testing.T) {
	if n := len(toolDescription); n > 1000 {
		t.Fatalf("description is %d bytes (~%d tokens)", n, n/4)
	}
}

func TestAdminTokens(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	type seen struct {
		ns    string
		admin bool
	}
	got := make(chan seen, 1)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{httpauth.Namespace(r.Context()), httpauth.IsAdmin(r.Context())}
	})
	hs := httptest.NewServer(Handler(s, HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tenant-token-1": "alice"}, AdminTokens: []string{"admin-token-0123456789"}})}))
	defer hs.Close()
	for _, tc := range []struct {
		name, token, header string
		status              int
		want                seen
	}{
		{"TenantIgnoresHeader", "tenant-token-1", "bob", http.StatusOK, seen{"alice", false}},
		{"AdminDefault", "admin-token-0123456789", "", http.StatusOK, seen{jobs.DefaultNamespace, true}},
		{"AdminNamesNamespace", "admin-token-0123456789", "bob", http.StatusOK, seen{"bob", true}},
		{"AdminBadNamespace", "admin-token-0123456789", "bob/../x", http.StatusBadRequest, seen{}},
		{"NotAdmin", "admin-token-0123456789x", "bob", http.StatusUnauthorized, seen{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), "GET", hs.URL+"/api/x", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
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
			if tc.status == http.StatusOK {
				if s := <-got; s != tc.want {
					t.Errorf("saw %+v, want %+v", s, tc.want)
				}
			}
		})
	}
	dir := t.TempDir()
	for _, bad := range []string{`{"tokens": {"tenant-token-1": "a"}, "admin_tokens": ["short"]}`, `{"tokens": {"tenant-token-1234567": "a"}, "admin_tokens": ["tenant-token-1234567"]}`} {
		p := filepath.Join(dir, "tokens.json")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTokensFile(p); err == nil {
			t.Errorf("%s: loaded", bad)
		}
	}
}

// mcpPost posts one JSON-RPC message to /mcp as token (with session, when
// set) and returns the status, the session id answered and the body.
func mcpPost(t *testing.T, url, token, session, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if session != "" {
		req.Header.Set(server.HeaderKeySessionID, session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(server.HeaderKeySessionID), string(b)
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// TestSessionsBelongToTheirNamespace attacks with another tenant's MCP
// session id: bob holds alice's session id (from a log, say) and uses it to
// call, listen and end it; each is refused as an unknown session, as is a
// well-formed id nobody issued, while alice's own requests go through.
func TestSessionsBelongToTheirNamespace(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	hs := httptest.NewServer(Handler(s, HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"alice-token-1": "alice", "bob-token-12": "bob"}})}))
	defer hs.Close()
	code, sid, body := mcpPost(t, hs.URL, "alice-token-1", "", initialize)
	if code != http.StatusOK || !strings.HasPrefix(sid, sessionPrefix) {
		t.Fatalf("initialize: %d %q %s", code, sid, body)
	}
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if code, _, body := mcpPost(t, hs.URL, "alice-token-1", sid, ping); code != http.StatusOK {
		t.Fatalf("alice's own session: %d %s", code, body)
	}
	forged := sessionPrefix + "0b3c6a1e-2f4d-4c8e-9a7b-1d2e3f4a5b6c.AAAAAAAAAAAAAAAAAAAAAAAA"
	for _, sess := range []string{sid, forged, strings.TrimSuffix(sid, sid[strings.LastIndexByte(sid, '.'):])} {
		if code, _, body := mcpPost(t, hs.URL, "bob-token-12", sess, ping); code != http.StatusNotFound || !strings.Contains(body, "unknown_session") {
			t.Fatalf("bob with session %q: %d %s", sess, code, body)
		}
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			req, _ := http.NewRequest(method, hs.URL+"/mcp", nil)
			req.Header.Set("Authorization", "Bearer bob-token-12")
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set(server.HeaderKeySessionID, sess)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close() // the status is what matters
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("bob %s with session %q: %d", method, sess, resp.StatusCode)
			}
		}
	}
	if code, _, body := mcpPost(t, hs.URL, "alice-token-1", forged, ping); code != http.StatusNotFound {
		t.Fatalf("alice with a forged session: %d %s", code, body)
	}
}

// TestRequestsPerTokenAreBounded: a token with its requests in flight (long
// ones: open event streams here) is refused one more with 429, and another
// token is not; a finished request gives its slot back.
func TestRequestsPerTokenAreBounded(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	hold := make(chan struct{})
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/hold" {
			<-hold
		}
		w.WriteHeader(http.StatusTeapot)
	})
	hs := httptest.NewServer(Handler(s, HTTPOptions{API: api, MaxRequestsPerToken: 2, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"alice-token-1": "alice", "bob-token-12": "bob"}})}))
	defer hs.Close()
	// Deferred after Close, so run before it: a failure before the release
	// below must not leave Close waiting for the held handlers.
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	defer release()
	get := func(token, path string) int {
		req, _ := http.NewRequest("GET", hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		_ = resp.Body.Close() // the status is what matters
		return resp.StatusCode
	}
	done := make(chan int, 2)
	for range 2 {
		go func() { done <- get("alice-token-1", "/api/hold") }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code := get("alice-token-1", "/api/x")
		if code == http.StatusTooManyRequests {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a third request of a token with two in flight: %d", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := get("bob-token-12", "/api/x"); code != http.StatusTeapot {
		t.Fatalf("another token: %d", code)
	}
	release()
	for range 2 {
		if code := <-done; code != http.StatusTeapot {
			t.Fatalf("held request: %d", code)
		}
	}
	if code := get("alice-token-1", "/api/x"); code != http.StatusTeapot {
		t.Fatalf("after the held ones ended: %d", code)
	}
}
