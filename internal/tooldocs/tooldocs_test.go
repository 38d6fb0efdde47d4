package tooldocs

import (
	"encoding/json"
	"testing"
)

func TestIdentifierAndAliases(t *testing.T) {
	for in, want := range map[string]string{"read-file": "read_file", "2fa": "_2fa", "class": "class_", "a.b c": "a_b_c"} {
		if got := Identifier(in); got != want {
			t.Errorf("Identifier(%q) = %q, want %q", in, got, want)
		}
	}
	al := Aliases([]string{"a-b", "a_b", "a.b"})
	if al["a-b"] != "a_b" || al["a_b"] != "a_b_2" || al["a.b"] != "a_b_3" {
		t.Fatalf("aliases %v", al)
	}
}

func TestSignatureAndSummary(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"},"tags":{"type":"array"}},"required":["path"]}`)
	if got := Signature("read_file", schema); got != "read_file(path: str, limit: int = None, tags: list = None)" {
		t.Fatalf("signature %q", got)
	}
	if got := Summary("Reads a file. Then more.\nSecond line"); got != "Reads a file." {
		t.Fatalf("summary %q", got)
	}
}

// TestSearchRanks checks ranking by meaning-ish matches (stems, prefixes, field
// weights), not substrings.
func TestSearchRanks(t *testing.T) {
	tools := []Tool{
		{Server: "fs", Name: "search-files", Description: "Find files whose names match a glob pattern, recursively.",
			InputSchema: json.RawMessage(`{"properties":{"pattern":{"type":"string","description":"glob"}}}`)},
		{Server: "fs", Name: "read_file", Description: "Read the complete contents of a file from disk."},
		{Server: "fs", Name: "write_file", Description: "Create or overwrite a file with new content."},
		{Server: "github", Name: "create_issue", Description: "Open a new issue in a GitHub repository."},
		{Server: "github", Name: "search_code", Description: "Search code across repositories."},
		{Server: "calc", Name: "add", Description: "Add two numbers."},
	}
	ix := NewIndex(tools)
	cases := []struct{ query, first string }{
		{"find files matching pattern", "search-files"},
		{"reading file contents", "read_file"},
		{"open an issue on github", "create_issue"},
		{"searching code in repos", "search_code"},
		{"sum numbers", "add"},
		{"writeFile", "write_file"},
	}
	for _, tc := range cases {
		hits := ix.Search(tc.query, 3)
		if len(hits) == 0 || hits[0].Tool.Name != tc.first {
			var got []string
			for _, h := range hits {
				got = append(got, h.Tool.Name)
			}
			t.Errorf("Search(%q) = %v, want %s first", tc.query, got, tc.first)
		}
	}
	if hits := ix.Search("zebra", 5); len(hits) != 0 {
		t.Errorf("unrelated query matched %v", hits)
	}
}

// TestBridgeAliases checks the bridge's alias rules against what its Python
// functions give (_sanitize_identifier for tools, MCPBridge._alias_for for
// servers), including their differences: tools are trimmed, cleaned before
// lower-casing and keyword-checked; servers are lower-cased first.
func TestBridgeAliases(t *testing.T) {
	for _, tc := range []struct{ in, tool, server string }{
		{"getUser", "getuser", "getuser"},
		{"read-file", "read_file", "read_file"},
		{"  Trim me ", "trim_me", "_trim_me_"},
		{"Class", "class_", "class"},
		{"IF", "if_", "if"},
		{"2FA", "_2fa", "_2fa"},
		{"a--b..c", "a_b_c", "a_b_c"},
		{"", "tool", "server"},
		{"\x1cX\x1c", "x", "_x_"},
		{"héllo", "h_llo", "h_llo"},
		{"İx", "_x", "i_x"},
		{"KELVIN\u212a", "kelvin_", "kelvink"},
		{"--", "_", "_"},
		{"None", "none", "none"},
		{"naïve-Tool", "na_ve_tool", "na_ve_tool"},
	} {
		if got := BridgeToolAlias(tc.in); got != tc.tool {
			t.Errorf("BridgeToolAlias(%q) = %q, want %q", tc.in, got, tc.tool)
		}
		if got := BridgeServerAlias(tc.in); got != tc.server {
			t.Errorf("BridgeServerAlias(%q) = %q, want %q", tc.in, got, tc.server)
		}
	}
	// The n-th tool of the same base alias gets _n, even when that is taken.
	al := BridgeToolAliases([]string{"A-b", "a_b", "a_b_2", "a.B"})
	if al["A-b"] != "a_b" || al["a_b"] != "a_b_2" || al["a_b_2"] != "a_b_2" || al["a.B"] != "a_b_3" {
		t.Fatalf("tool aliases %v", al)
	}
	sa := BridgeServerAliases([]string{"github", "GitHub", "Git-Hub"})
	if sa["Git-Hub"] != "git_hub" || sa["GitHub"] != "github" || sa["github"] != "github_2" {
		t.Fatalf("server aliases %v", sa)
	}
}

func TestDocumentKeys(t *testing.T) {
	tool := Tool{Server: "GitHub", Name: "getUser", Description: " Get a user. By login. ", InputSchema: json.RawMessage(`{"type":"object"}`)}
	for _, full := range []bool{false, true} {
		b, _ := json.Marshal(Document(tool, "getUser", "github", "getuser", full))
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		if m["alias"] != "getUser" || m["toolAlias"] != "getuser" || m["serverAlias"] != "github" || m["description"] != "Get a user. By login." ||
			m["summary"] != "Get a user." || (m["inputSchema"] != nil) != full || (m["input_schema"] != nil) != full {
			t.Errorf("full=%v: %s", full, b)
		}
	}
}
