package proxyresp_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// BenchmarkProxiedCallAudit: what the audit adds to a proxied tool call,
// measured where the code sees it. Two stacks run in the same benchmark, one
// recording every call to the audit stream (the front-end's writer), one
// whose front-end's Auditor does nothing; each op runs one job of 50
// sequential echo calls on each, alternately, and the code times every
// call. Reported: the p50 and p90 of a call without and with the audit, and
// the p50's difference (the bound: 0.2 ms).
func BenchmarkProxiedCallAudit(b *testing.B) {
	off := setup(b, "", frontend.Config{ID: "fe-off", Audit: proxyresp.AuditorFunc(func(auditlog.Call) {})}, testutil.TestServerDef(b, "ts", nil))
	on := setup(b, "", frontend.Config{ID: "fe-on"}, testutil.TestServerDef(b, "ts", nil))
	const calls = 50
	code := fmt.Sprintf(`import time, json
d = []
for i in range(%d):
    t = time.perf_counter()
    await mcp_ts.echo(text='call %%d with some arguments' %% i, token='s3cret')
    d.append(time.perf_counter() - t)
print(json.dumps(d))`, calls)
	times := map[string][]float64{}
	runOn := func(name string, s *testutil.Stack) {
		var d []float64
		out := mustRun(b, s.C, code, "ts")
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &d); err != nil || len(d) != calls {
			b.Fatalf("%s: %v %q", name, err, out)
		}
		times[name] = append(times[name], d...)
	}
	runOn("off", off) // warm: the servers started, the sandboxes ready
	runOn("on", on)
	clear(times)
	b.ResetTimer()
	for range b.N {
		runOn("off", off)
		runOn("on", on)
	}
	b.StopTimer()
	pct := func(name string, p float64) float64 {
		d := slices.Clone(times[name])
		slices.Sort(d)
		return d[int(p*float64(len(d)-1))] * 1000
	}
	b.ReportMetric(pct("off", 0.5), "off-p50-ms")
	b.ReportMetric(pct("on", 0.5), "on-p50-ms")
	b.ReportMetric(pct("off", 0.9), "off-p90-ms")
	b.ReportMetric(pct("on", 0.9), "on-p90-ms")
	b.ReportMetric(pct("on", 0.5)-pct("off", 0.5), "audit-p50-ms")
	// The entries reach the trail (not only the queue).
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, _, err := on.FE.AuditEntries(b.Context(), "", auditQuery(1))
		if err == nil && len(v) == 1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("no audit entry listed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func auditQuery(limit int) audit.Query { return audit.Query{Limit: limit} }
