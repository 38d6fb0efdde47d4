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
	code := EchoTimingCode(benchCalls)
	var ds []time.Duration
	for b.Loop() {
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "bench-call", Code: code, Servers: []string{"ts"}, Timeout: time.Minute}, echoHost{})
		if err != nil || res.Status != sandbox.StatusSuccess {
			b.Fatalf("%v %+v", err, res)
		}
		got, err := Micros(res.Stdout)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "call-p50-us")
	b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds()), "call-p90-us")
}

// EchoTimingCode is Python that awaits `mcp_ts.echo` once to warm up, then
// n times in a row, each timed with time.perf_counter, and prints the n
// times in microseconds (Micros reads them).
func EchoTimingCode(n int) string {
	return fmt.Sprintf(`import time
await mcp_ts.echo(text="warm")
ts = []
for _ in range(%d):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append(int((time.perf_counter() - t0) * 1e6))
print(" ".join(map(str, ts)))`, n)
}

// Micros reads times printed as whole microseconds separated by spaces
// (EchoTimingCode's output).
func Micros(out string) ([]time.Duration, error) {
	var ds []time.Duration
	for f := range strings.FieldsSeq(out) {
		us, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("the job printed %q: %w", out, err)
		}
		ds = append(ds, time.Duration(us)*time.Microsecond)
	}
	return ds, nil
}
