package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
)

// TestTokensFilePools: the tokens file's policies take pools; a namespace
// without them inherits default_policy's; a bad pool name is a usage error.
func TestTokensFilePools(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		f := filepath.Join(dir, "tokens.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := write(`{"tokens": {"tok-gpu-0123456789": "gpu", "tok-plain-0123456789": "plain"},
		"default_policy": {"pools": ["default"]},
		"namespaces": {"gpu": {"pools": ["default", "gpu"]}, "plain": {"max_sessions": 2}}}`)
	c, err := parse([]string{"--auth-tokens-file", f}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def, policies := c.policies()
	if !slices.Equal(def.Pools, []string{"default"}) {
		t.Fatalf("default policy pools: %v", def.Pools)
	}
	if got := policies["gpu"].Pools; !slices.Equal(got, []string{"default", "gpu"}) {
		t.Fatalf("gpu pools: %v", got)
	}
	if got := policies["plain"].Pools; !slices.Equal(got, []string{"default"}) {
		t.Fatalf("plain inherits pools: %v", got)
	}
	f = write(`{"tokens": {"tok-gpu-0123456789": "gpu"}, "namespaces": {"gpu": {"pools": ["no pool"]}}}`)
	_, err = parse([]string{"--auth-tokens-file", f}, io.Discard)
	if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), `pool "no pool"`) {
		t.Fatalf("bad pool name: %v", err)
	}
}
