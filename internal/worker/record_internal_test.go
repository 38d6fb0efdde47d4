package worker

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// TestShrinkOutputKeepsCharacters: output too large for a message is cut at
// a character boundary, each stream on its own, and marked truncated.
func TestShrinkOutputKeepsCharacters(t *testing.T) {
	res := jobs.Result{Stdout: strings.Repeat("é", 10), Stderr: "abc"}
	shrinkOutput(&res, 5)
	if res.Stdout != "éé" || !res.StdoutTruncated || !utf8.ValidString(res.Stdout) {
		t.Fatalf("stdout %q truncated %v", res.Stdout, res.StdoutTruncated)
	}
	if res.Stderr != "abc" || res.StderrTruncated {
		t.Fatalf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
}
