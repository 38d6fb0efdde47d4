package sandboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// echoHost answers every proxy call at once: a tool "echo" for list_tools,
// an MCP result of "x" for anything else.
type echoHost struct{}

func (echoHost) Call(_ context.Context, method string, _ json.RawMessage) (json.RawMessage, error) {
	if method == "list_tools" {
		return json.RawMessage(`[{"name":"echo","description":"echo","input_schema":{"type":"object"}}]`), nil
	}
	return json.RawMessage(`{"content":[{"type":"text","text":"x"}]}`), nil
}

func (echoHost) Output(string, string) {}

// benchCalls is how many calls one job of BenchCall makes: under the
// per-job burst (sandbox.CallBurst), so none waits for the rate limit.
const benchCalls = 80

// BenchCall measures the sandbox's share of a proxied call: sandbox code's
// `await mcp_ts.echo(text="x")` through the code's process, the runner and
// the host's connection to it, answered at once by the host. Each op is one
// job of benchCalls calls, each timed in the sandbox; it reports the calls'
// p50 and p90 in microseconds.
func BenchCall(b *testing.B, rt sandbox.Runtime) {
	code := fmt.Sprintf(`import time
await mcp_ts.echo(text="warm")
ts = []
for _ in range(%d):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append(int((time.perf_counter() - t0) * 1e6))
print(" ".join(map(str, ts)))`, benchCalls)
	var us []int
	for b.Loop() {
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "bench-call", Code: code, Servers: []string{"ts"}, Timeout: time.Minute}, echoHost{})
		if err != nil || res.Status != sandbox.StatusSuccess {
			b.Fatalf("%v %+v", err, res)
		}
		for f := range strings.FieldsSeq(res.Stdout) {
			v, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("the job printed %q: %v", res.Stdout, err)
			}
			us = append(us, v)
		}
	}
	slices.Sort(us)
	b.ReportMetric(float64(us[len(us)/2]), "call-p50-us")
	b.ReportMetric(float64(us[len(us)*9/10]), "call-p90-us")
}
