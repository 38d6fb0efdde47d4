package sandbox

import (
	"regexp"
	"slices"
	"testing"

	"github.com/mcpexec/mcpexec/internal/proxy"
)

// TestSupervisorKnowsTheProxyMethods: the supervisor in the sandbox refuses
// methods outside its list before they reach the host, so its list and the
// host's must be the same.
func TestSupervisorKnowsTheProxyMethods(t *testing.T) {
	src, err := runnerFiles.ReadFile("mcpexec_protocol.py")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)KNOWN_METHODS = frozenset\(\((.*?)\)\)`).FindSubmatch(src)
	if block == nil {
		t.Fatal("no KNOWN_METHODS in mcpexec_protocol.py")
	}
	var py []string
	for _, m := range regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(block[1], -1) {
		py = append(py, string(m[1]))
	}
	slices.Sort(py)
	if want := proxy.Methods(); !slices.Equal(py, want) {
		t.Fatalf("the supervisor's methods %v differ from the host's %v", py, want)
	}
}
