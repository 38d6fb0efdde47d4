package mcpserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/server"
)

func TestGuardHostOriginTokens(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	var sawNS string
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawNS = NamespaceFromContext(r.Context())
		w.WriteHeader(http.StatusTeapot)
	})
	hs := httptest.NewServer(Handler(s, HTTPOptions{Tokens: map[string]string{"secret-token-1": "alice"}, API: api,
		AllowedHosts: []string{"proxy.local"}, MaxBody: 1024}))
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
		got <- seen{NamespaceFromContext(r.Context()), IsAdmin(r.Context())}
	})
	hs := httptest.NewServer(Handler(s, HTTPOptions{Tokens: map[string]string{"tenant-token-1": "alice"}, AdminTokens: []string{"admin-token-0123456789"}, API: api}))
	defer hs.Close()
	for _, tc := range []struct {
		name, token, header string
		status              int
		want                seen
	}{
		{"TenantIgnoresHeader", "tenant-token-1", "bob", http.StatusOK, seen{"alice", false}},
		{"AdminDefault", "admin-token-0123456789", "", http.StatusOK, seen{DefaultNamespace, true}},
		{"AdminNamesNamespace", "admin-token-0123456789", "bob", http.StatusOK, seen{"bob", true}},
		{"AdminBadNamespace", "admin-token-0123456789", "bob/../x", http.StatusBadRequest, seen{}},
		{"NotAdmin", "admin-token-0123456789x", "bob", http.StatusUnauthorized, seen{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), "GET", hs.URL+"/api/x", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
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
