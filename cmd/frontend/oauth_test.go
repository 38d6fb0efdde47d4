package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/oauth"
	"github.com/mcpexec/mcpexec/internal/oauth/oauthtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestOAuthFlagsWired: the front-end started with --oauth-issuer serves the
// protected resource metadata for its /mcp (the default audience), refuses
// a request without a token with the challenge naming it, accepts the
// issuer's token for its audience, and refuses one for another audience or
// without the route's scope.
func TestOAuthFlagsWired(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no Podman needed: the HTTP surface answers at once
	is := oauthtest.NewIssuer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // only its port was wanted
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--http", addr, "--oauth-issuer", is.URL, "--data", filepath.Join(dir, "data"),
			"--podman", "unix://" + filepath.Join(dir, "no.sock"), "--discover=false", "--worker-id", "test-oauth"},
			strings.NewReader(""), nil, testLogWriter(t))
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if cli.ExitCode(err) != cli.ExitOK {
				t.Errorf("front-end exited with %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("front-end did not stop within 60s of cancellation")
		}
	}()
	base := "http://" + addr
	var resp *http.Response
	for i := 0; ; i++ {
		if resp, err = http.Get(base + "/.well-known/oauth-protected-resource/mcp"); err == nil {
			break
		}
		if i > 600 {
			t.Fatalf("front-end not listening: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var m oauth.Metadata
	err = json.NewDecoder(resp.Body).Decode(&m)
	_ = resp.Body.Close() // read
	if err != nil || m.Resource != base+"/mcp" || len(m.AuthorizationServers) != 1 || m.AuthorizationServers[0] != is.URL {
		t.Fatalf("metadata %+v, %v", m, err)
	}
	req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader("{}"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // status and header only
	if ch := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 401 || !strings.Contains(ch, `resource_metadata="`+base+`/.well-known/oauth-protected-resource/mcp"`) {
		t.Fatalf("no token: %d %q", resp.StatusCode, ch)
	}
	// The issuer's token passes the guard: the MCP client it authenticates
	// runs run_python, which says Podman is missing (as without OAuth;
	// waiting for that answer also lets the embedded broker finish starting
	// before the test stops it).
	good := is.Mint(t, is.Claims(base+"/mcp", "alice", "mcpexec:run"))
	c, err := client.NewStreamableHttpClient(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + good}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }() // the test is over
	testutil.StartMCP(t, ctx, c, "oauth-wired")
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(1)"})
	if text := testutil.Text(res); !res.IsError || !strings.Contains(text, "apt-get install podman") {
		t.Fatalf("run_python: isError=%v %q", res.IsError, text)
	}
	for tok, refused := range map[string]bool{
		is.Mint(t, is.Claims(base+"/mcp", "alice", "mcpexec:jobs")):            false,
		is.Mint(t, is.Claims("http://elsewhere/mcp", "alice", "mcpexec:jobs")): true,
		is.Mint(t, is.Claims(base+"/mcp", "alice", "mcpexec:run")):             true,
	} {
		req, _ := http.NewRequest("GET", base+"/api/jobs", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close() // status only
		if got := resp.StatusCode == 401 || resp.StatusCode == 403; got != refused {
			t.Errorf("GET /api/jobs: %d, refused should be %v", resp.StatusCode, refused)
		}
	}
}
