package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// buildFrontend builds cmd/frontend with the Podman build tags.
func buildFrontend(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "frontend")
	cmd, cancel := testenv.Command(15*time.Minute, "go", "build", "-tags", "remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp", "-o", bin, "./cmd/frontend")
	defer cancel()
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build frontend: %v\n%s", err, out)
	}
	return bin
}

type sdkResult struct {
	Tools         []string `json:"tools"`
	ServersEnum   []string `json:"serversEnum"`
	Text          string   `json:"text"`
	IsError       bool     `json:"isError"`
	Status        string   `json:"status"`
	Progress      []string `json:"progress"`
	ManualListsTs bool     `json:"manualListsTs"`
}

// TestOfficialTypeScriptSDK connects a client built on @modelcontextprotocol/sdk
// to the real front-end binary over stdio and over streamable HTTP (with a
// bearer token), and runs proxied code in Podman sandboxes.
func TestOfficialTypeScriptSDK(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	scriptPath := testutil.NodeScript(t, "sdk_client.mjs")
	bin := buildFrontend(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "servers.json")
	servers, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{
		"ts": map[string]any{"command": testutil.TestServer(t), "description": "the test server"}}})
	if err := os.WriteFile(cfg, servers, 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--servers", cfg, "--discover=false", "--pool", "1", "--log-level", "warn"}

	check := func(t *testing.T, out []byte) {
		t.Helper()
		var r sdkResult
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatalf("client output %s: %v", out, err)
		}
		// run_javascript joins run_python once the embedded worker's image
		// turns out to run JavaScript (the list may be read before or after).
		tools := slices.Sorted(slices.Values(r.Tools))
		if (!slices.Equal(tools, []string{"run_python"}) && !slices.Equal(tools, []string{"run_javascript", "run_python"})) ||
			!slices.Equal(r.ServersEnum, []string{"ts"}) || !r.ManualListsTs {
			t.Errorf("surface: %+v", r)
		}
		if r.IsError || r.Status != "success" || r.Text != "hello from the TS SDK\n1" {
			t.Errorf("run_python: %+v", r)
		}
		if !slices.Contains(r.Progress, "queued") {
			t.Errorf("progress %v", r.Progress)
		}
	}

	t.Run("stdio", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		args := append([]string{scriptPath, "stdio", bin}, append(common, "--data", filepath.Join(dir, "stdio"), "--worker-id", "sdk-stdio")...)
		cmd := exec.CommandContext(ctx, "node", args...)
		// The front-end node starts shares node's stderr: once ctx has
		// killed node, do not wait on a pipe that front-end still holds.
		cmd.WaitDelay = 15 * time.Second
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node client: %v\n%s", err, out)
		}
		check(t, out)
	})

	t.Run("http", func(t *testing.T) {
		tokens := filepath.Join(dir, "tokens")
		if err := os.WriteFile(tokens, []byte("sdk-test-token-0123 sdk\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		fe := startFrontend(t, bin, append(common, "--data", filepath.Join(dir, "http"), "--worker-id", "sdk-http",
			"--auth-tokens-file", tokens)...)
		addr := fe.addr
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "node", scriptPath, "http", "http://"+addr+"/mcp", "sdk-test-token-0123").Output()
		if err != nil {
			t.Fatalf("node client: %v\n%s", err, out)
		}
		check(t, out)
		// Without the token the request is refused.
		resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close() // read or abandoned: nothing to report
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("no token: %d", resp.StatusCode)
		}
	})
}

// TestOfficialTypeScriptSDKv2 connects clients built on the SDK's v2
// (@modelcontextprotocol/client) to the real front-end binary in both
// protocol eras, 2026-07-28 (stateless, pinned) and 2025-11-25 (initialize),
// over stdio and over streamable HTTP, and runs code in Podman sandboxes.
func TestOfficialTypeScriptSDKv2(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	scriptPath := testutil.NodeScript(t, "sdk_v2_client.mjs")
	bin := buildFrontend(t)
	dir := t.TempDir()
	common := []string{"--discover=false", "--pool", "1", "--log-level", "warn", "--languages", "python"}
	type result struct {
		Era      string   `json:"era"`
		Tools    []string `json:"tools"`
		Prompts  int      `json:"prompts"`
		Text     string   `json:"text"`
		IsError  bool     `json:"isError"`
		Status   string   `json:"status"`
		Progress []string `json:"progress"`
		Manual   bool     `json:"manual"`
	}
	check := func(t *testing.T, era string, r result) {
		t.Helper()
		if r.Era != era || !slices.Equal(r.Tools, []string{"run_python"}) || r.Prompts != 0 || !r.Manual {
			t.Errorf("surface: %+v", r)
		}
		if r.IsError || r.Status != "success" || r.Text != "hello from the v2 SDK" {
			t.Errorf("run_python: %+v", r)
		}
		if !slices.Contains(r.Progress, "queued") {
			t.Errorf("progress %v", r.Progress)
		}
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("sdk-v2-token-0123 sdk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fe := startFrontend(t, bin, append(common, "--data", filepath.Join(dir, "http"), "--worker-id", "sdk-v2-http",
		"--auth-tokens-file", tokens)...)
	for _, era := range []string{"modern", "legacy"} {
		t.Run(era+"/stdio", func(t *testing.T) {
			var r result
			runNode(t, &r, append([]string{scriptPath, era, "stdio", bin}, append(common,
				"--data", filepath.Join(dir, "stdio-"+era), "--worker-id", "sdk-v2-stdio-"+era)...)...)
			check(t, era, r)
		})
		t.Run(era+"/http", func(t *testing.T) {
			var r result
			runNode(t, &r, scriptPath, era, "http", fe.url(), "sdk-v2-token-0123")
			check(t, era, r)
		})
	}
}

// TestOfficialTypeScriptSDKElicitation: the official TypeScript SDK client
// (2025-11-25) declares elicitation; its run_python's ts/add call is parked
// by the namespace's tool rules, the front-end binary asks the client, and
// its answer decides the call within the same run_python: approved, the
// code prints the tool's answer; denied, it handles MCPError.
func TestOfficialTypeScriptSDKElicitation(t *testing.T) {
	testAskingClient(t, "elicit_client.mjs", "sdk-elicit", "")
}

// TestOfficialTypeScriptSDKv2InputRequired: the official TypeScript SDK v2
// client, pinned to 2026-07-28, where a server may not send requests of its
// own: its run_python's ts/add call is parked by the namespace's tool rules,
// the call returns input_required with a form elicitation, the SDK's multi
// round-trip driver asks the client's handler and retries with the answer
// and the requestState, and the retry ends with the job's result: approved,
// the code prints the tool's answer; denied, it handles MCPError.
func TestOfficialTypeScriptSDKv2InputRequired(t *testing.T) {
	testAskingClient(t, "mrtr_client.mjs", "sdk-mrtr", "modern")
}

// testAskingClient runs the client script, which answers every question
// about a parked call with its third argument, against a front-end whose
// namespace asks for ts/add, approving and then denying. era is the
// protocol era the client must report ("" when it reports none).
func testAskingClient(t *testing.T, script, name, era string) {
	scriptPath := testutil.NodeScript(t, script)
	token := name + "-token-0123"
	fe := startAskingFrontend(t, name, tsServer(t), token, map[string]string{"ts/add": "ask"})
	for _, approve := range []string{"true", "false"} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		out, err := exec.CommandContext(ctx, "node", scriptPath, "http://"+fe.addr+"/mcp", token, approve).Output()
		cancel()
		if err != nil {
			t.Fatalf("node client (approve %s): %v\n%s", approve, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var r struct {
			Era     string   `json:"era"`
			Text    string   `json:"text"`
			IsError bool     `json:"isError"`
			Asked   []string `json:"asked"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatalf("client output %s: %v", out, err)
		}
		want := "sum 42"
		if approve == "false" {
			want = "MCPError: ts/add was denied by " + mcpserver.ElicitedBy + " (approval "
		}
		if r.Era != era || r.IsError || len(r.Asked) != 1 || !strings.Contains(r.Asked[0], "ts/add") || !strings.Contains(r.Text, want) {
			t.Fatalf("approve %s: %+v, want era %q, text with %q and one question", approve, r, era, want)
		}
	}
}

// tsServer is the servers file's entry of the test server, "ts".
func tsServer(t *testing.T) map[string]any {
	return map[string]any{"ts": map[string]any{"command": testutil.TestServer(t), "description": "the test server"}}
}

// startAskingFrontend starts the front-end binary with its embedded broker
// and Podman worker (named name), proxying servers (the servers file's
// mcpServers), and one caller: token, of a namespace whose tool rules are
// rules. It skips, or fails under make test, without Podman.
func startAskingFrontend(t *testing.T, name string, servers map[string]any, token string, rules map[string]string) *frontendProc {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	bin := buildFrontend(t)
	dir := t.TempDir()
	cfg, tokensFile := filepath.Join(dir, "servers.json"), filepath.Join(dir, "tokens.json")
	serversData, _ := json.Marshal(map[string]any{"mcpServers": servers})
	tokens, _ := json.Marshal(map[string]any{
		"tokens":     map[string]string{token: "asker"},
		"namespaces": map[string]any{"asker": map[string]any{"tools": rules}},
	})
	for path, data := range map[string][]byte{cfg: serversData, tokensFile: tokens} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return startFrontend(t, bin, "--servers", cfg, "--discover=false", "--pool", "1", "--log-level", "warn",
		"--data", filepath.Join(dir, "data"), "--worker-id", name, "--auth-tokens-file", tokensFile)
}
