package proxyresp_test

import (
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/proxyresp"
)

func TestSavedToolChecks(t *testing.T) {
	for _, name := range []string{"f", "_x", "fetch_all2", "match", strings.Repeat("a", proxyresp.MaxSavedToolName)} {
		if err := proxyresp.CheckSavedToolName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
	for _, name := range []string{"", "2x", "a-b", "a b", "class", "None", "é", "a.b", strings.Repeat("a", proxyresp.MaxSavedToolName+1)} {
		if err := proxyresp.CheckSavedToolName(name); err == nil {
			t.Errorf("%q accepted", name)
		}
	}
	if err := proxyresp.CheckSavedToolSource("def f(): pass"); err != nil {
		t.Error(err)
	}
	for _, src := range []string{"", " \n", strings.Repeat("#", proxyresp.MaxSavedToolSource+1)} {
		if err := proxyresp.CheckSavedToolSource(src); err == nil {
			t.Errorf("source of %d bytes accepted", len(src))
		}
	}
}
