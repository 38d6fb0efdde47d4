package mcpserver

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// FuzzParseArgs feeds run_python's arguments as a hostile client might send
// them (any JSON, or none): parseArgs never panics, and either refuses with
// an invalid-argument error that says what was wanted, or returns a job with
// the code given and a timeout of at least a second when one was set.
func FuzzParseArgs(f *testing.F) {
	for _, seed := range []string{
		`{"code":"print(1)"}`,
		`{"code":"x","servers":["a","b"],"timeout":30,"session":"s1"}`,
		`{"code":"x","timeout":1.5}`,
		`{"code":"x","timeout":-3}`,
		`{"code":"x","timeout":"10"}`,
		`{"code":"x","timeout":1e300}`,
		`{"code":null}`,
		`{"code":7}`,
		`{"servers":"a"}`,
		`[]`,
		`"code"`,
		`null`,
		`{"code":"x","unknown":true}`,
		`{"code":"\u0000"}`,
	} {
		f.Add(ToolName, seed)
		f.Add(JSToolName, seed)
	}
	f.Fuzz(func(t *testing.T, tool, raw string) {
		var v any
		if json.Unmarshal([]byte(raw), &v) != nil {
			return // the MCP layer hands parseArgs decoded JSON only
		}
		job, err := parseArgs(tool, v)
		if err != nil {
			var inv *jobs.InvalidError
			if errs.KindOf(err) != errs.Invalid && !errors.As(err, &inv) {
				t.Fatalf("%s %s: an error that is not an invalid argument: %v", tool, raw, err)
			}
			if !strings.Contains(err.Error(), "code") && !strings.Contains(err.Error(), "timeout") {
				t.Fatalf("%s %s: an error that does not say what was wanted: %v", tool, raw, err)
			}
			return
		}
		// encoding/json matches names without regard to case, so "Code"
		// is taken as code too (when several spell it, the last wins).
		m, _ := v.(map[string]any)
		codes := []string{}
		for k, c := range m {
			if s, ok := c.(string); ok && strings.EqualFold(k, "code") {
				codes = append(codes, s)
			}
		}
		if !slices.Contains(codes, job.Code) {
			t.Fatalf("%s %s: code %q, want one of %q", tool, raw, job.Code, codes)
		}
		if _, set := m["timeout"]; set && m["timeout"] != nil && job.Timeout < 1 {
			t.Fatalf("%s %s: timeout %d accepted", tool, raw, job.Timeout)
		}
	})
}
