package proxyresp_test

import (
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/toolrules"
)

// BenchmarkToolRules: what the tool rules cost a proxied call they allow,
// next to the same call without rules (issue 25's bound: 0.2 ms at p50).
// Each op is one job of 200 sequential calls of ts/echo per case, timed in
// the sandbox; the p50 and p90 are per call, over every op.
// "rule" allows echo by a glob among others; "annotations" matches no rule,
// so echo's annotations decide (mcp-go's defaults: destructiveHint true,
// allowed here by tool_defaults).
func BenchmarkToolRules(b *testing.B) {
	cases := []struct {
		name     string
		rules    map[string]string
		defaults *toolrules.Defaults
	}{
		{"none", nil, nil},
		{"rule", map[string]string{"ts/delete_*": "deny", "ts/ec*": "allow", "*/*": "ask", "other/*": "deny", "ts/add": "ask"}, nil},
		{"annotations", map[string]string{"ts/delete_*": "deny", "ts/add": "ask"}, &toolrules.Defaults{Destructive: "allow"}},
	}
	code := `import time
ts = []
for _ in range(200):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append((time.perf_counter() - t0) * 1000)
print(" ".join("%.4f" % x for x in ts))`
	stacks := make([]*testutil.Stack, len(cases))
	for i, c := range cases {
		stacks[i] = setup(b, "", frontend.Config{Policy: frontend.Policy{Tools: c.rules, ToolDefaults: c.defaults}}, testutil.TestServerDef(b, "ts", nil))
		mustRun(b, stacks[i].C, code, "ts") // warm: the server started, the sandbox ready
	}
	samples := make([][]float64, len(cases))
	b.ResetTimer()
	for range b.N {
		// The cases take turns, so a busy moment of the machine falls on
		// each alike.
		for i := range cases {
			for _, f := range strings.Fields(mustRun(b, stacks[i].C, code, "ts")) {
				v, err := strconv.ParseFloat(f, 64)
				if err != nil {
					b.Fatal(err)
				}
				samples[i] = append(samples[i], v)
			}
		}
	}
	b.StopTimer()
	for i, c := range cases {
		all := samples[i]
		sort.Float64s(all)
		b.ReportMetric(all[len(all)/2], c.name+"-p50-ms")
		b.ReportMetric(all[len(all)*9/10], c.name+"-p90-ms")
	}
	b.ReportMetric(0, "ns/op")
}
