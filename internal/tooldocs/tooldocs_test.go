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
