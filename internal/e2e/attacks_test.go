package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// heapWatch samples the process's heap in use and keeps its peak.
type heapWatch struct {
	stop chan struct{}
	done chan struct{}
	peak atomic.Uint64
	base uint64
}

func watchHeap() *heapWatch {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	h := &heapWatch{stop: make(chan struct{}), done: make(chan struct{}), base: ms.HeapInuse}
	go func() {
		defer close(h.done)
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > h.peak.Load() {
				h.peak.Store(ms.HeapInuse)
			}
			select {
			case <-h.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return h
}

func (h *heapWatch) end() (base, peak uint64) {
	close(h.stop)
	<-h.done
	return h.base, h.peak.Load()
}

// maxHeapGrowth bounds what the attacks may add to the heap of the process
// that holds the front-end, the worker and the broker (each attack of issue 9
// grew a front-end by 100 to 200 MiB).
const maxHeapGrowth = 96 << 20

// TestAttacksThroughFleet runs the attacks of issue 9 from run_python and from
// a second tenant through a real fleet (broker, worker with Podman, front-end
// over HTTP with tokens): each fails, the fleet keeps serving, and the heap
// stays within maxHeapGrowth.
func TestAttacksThroughFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("attacks through Podman")
	}
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 2}})
	wc := worker.DefaultConfig("attacked")
	testutil.Worker(t, b, rt, wc)
	m := metrics.New("frontend")
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "fe", Metrics: m, Policy: frontend.DefaultPolicy(),
		Policies: map[string]frontend.Policy{"a": frontend.Policy{MemoryBytes: 8 << 20}.Inherit(frontend.DefaultPolicy())}})
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	srv := mcpserver.New(fe, mcpserver.Options{Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{API: api, Health: fe.Health, Extra: map[string]http.Handler{"GET /metrics": m.Handler()}, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-aaaaaaaa": "a", "tok-bbbbbbbb": "b"}})}))
	t.Cleanup(hs.Close)
	c := mcpClient(t, hs.URL, "tok-aaaaaaaa")
	heap := watchHeap()

	run := func(t *testing.T, code string, timeout int, progress bool) (mcpserver.Structured, time.Duration) {
		t.Helper()
		req := mcp.CallToolRequest{}
		req.Params.Name = mcpserver.ToolName
		req.Params.Arguments = map[string]any{"code": code, "timeout": timeout}
		if progress {
			req.Params.Meta = &mcp.Meta{ProgressToken: "p"}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		start := time.Now()
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		return testutil.Structured(t, res), time.Since(start)
	}
	healthy := func(t *testing.T) {
		t.Helper()
		if st, _ := run(t, "print('still serving')", 30, false); st.Status != "success" || st.Stdout[0] != "still serving" {
			t.Fatalf("the fleet stopped serving: %+v", st)
		}
	}

	t.Run("ReachTheRunnersChannel", func(t *testing.T) {
		st, _ := run(t, sandboxtest.FrameHelpers+`
n = send_all(frame({"type": "out", "stream": "stdout", "data": "FORGED"}) + frame({"type": "done", "status": "success", "exit_code": 0}))
print("wrote to", n)
import time; time.sleep(1)`, 10, false)
		if strings.Contains(strings.Join(st.Stdout, "\n"), "FORGED") {
			t.Fatalf("a forged frame reached the host: %+v", st)
		}
		t.Logf("forging on the reachable sockets: status %s, error %q", st.Status, st.Error)
		healthy(t)
	})
	t.Run("WedgeWorkerSlots", func(t *testing.T) {
		// As many calls as the worker has slots, each flooding calls it never
		// reads the answers of, with a 4 s limit.
		code := sandboxtest.FrameHelpers + `
import threading, time
def flood(s):
    i = 1
    while True:
        try:
            s.sendall(frame({"type": "call", "id": i, "method": "memory_get", "params": {"key": "k" * 1000}}))
        except OSError:
            return
        i += 1
for s in reachable_sockets():
    threading.Thread(target=flood, args=(s,), daemon=True).start()
time.sleep(600)`
		var wg sync.WaitGroup
		for range wc.Slots {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, took := run(t, code, 4, false)
				if st.Status == "success" || took > 4*time.Second+15*time.Second {
					t.Errorf("wedging call: %s after %s", st.Status, took)
				}
			}()
		}
		wg.Wait()
		healthy(t)
	})
	t.Run("HugeMethodNames", func(t *testing.T) {
		st, _ := run(t, sandboxtest.FrameHelpers+`
for k in range(40):
    name = os.urandom(3 << 19).hex()  # 3 MiB of random name
    for s in reachable_sockets():
        try:
            s.sendall(frame({"type": "call", "id": k + 1, "method": name, "params": {}}))
        except OSError:
            pass
import time; time.sleep(1)
print("sent")`, 60, false)
		t.Logf("huge method names: status %s, error %q", st.Status, st.Error)
		resp, err := http.Get(hs.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close() // read or abandoned: nothing to report
		if len(body) > 1<<20 {
			t.Fatalf("/metrics grew to %d bytes", len(body))
		}
		for _, line := range strings.Split(string(body), "\n") {
			if len(line) > 1000 {
				t.Fatalf("/metrics has a line of %d bytes", len(line))
			}
		}
		healthy(t)
	})
	t.Run("OutputFloodWithProgress", func(t *testing.T) {
		st, _ := run(t, "import os\nchunk = b'z' * (8 << 20)\nfor _ in range(8):\n    os.write(1, chunk)", 60, true)
		out := strings.Join(st.Stdout, "\n")
		if st.Status != "success" || len(out) > 1<<20+1 {
			t.Fatalf("flood: status %s, %d bytes of stdout kept", st.Status, len(out))
		}
		healthy(t)
	})
	t.Run("FillTheBrokersDisk", func(t *testing.T) {
		st, _ := run(t, `
v = "x" * 900_000
n = 0
try:
    for i in range(300):
        save_memory("big-%d" % i, v)
        n += 1
except MCPError as e:
    print("refused after", n, ":", e)`, 120, false)
		out := strings.Join(st.Stdout, "\n")
		if !strings.Contains(out, "refused after") || !strings.Contains(out, "quota") {
			t.Fatalf("memory flood: %+v", st)
		}
		used, err := b.Store().MemoryUsage("a")
		if err != nil || used > 8<<20 {
			t.Fatalf("namespace a holds %d bytes of memory (%v), over its 8 MiB quota", used, err)
		}
		t.Logf("memory flood: %s (namespace holds %d bytes)", out, used)
		healthy(t)
	})
	t.Run("AnotherTenantsJob", func(t *testing.T) {
		post := func(token string, body any) (int, string) {
			st, got := testutil.HTTPCall(t, token, "POST", hs.URL+"/api/jobs", body)
			return st, string(got)
		}

		if st, body := post("tok-aaaaaaaa", map[string]any{"id": "private", "code": "print('secret of a')"}); st != http.StatusCreated {
			t.Fatalf("a: %d %s", st, body)
		}
		st, body := post("tok-bbbbbbbb", map[string]any{"id": "private", "code": "print(1)"})
		if st != http.StatusCreated || strings.Contains(body, "secret of a") {
			t.Fatalf("b submitting a's id: %d %s", st, body)
		}
	})
	base, peak := heap.end()
	t.Logf("heap in use: %d MiB before the attacks, peak %d MiB during them (front-end, worker and broker in one process)", base>>20, peak>>20)
	if peak > base+maxHeapGrowth {
		t.Fatalf("the attacks grew the heap by %d MiB, over the bound of %d MiB", (peak-base)>>20, maxHeapGrowth>>20)
	}
}

// mcpClient is an initialised MCP client of url with a bearer token.
func mcpClient(t *testing.T, url, token string) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient(url+"/mcp", transport.WithHTTPTimeout(5*time.Minute),
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // the test is over with it: a failing close changes no result
	testutil.StartMCP(t, context.Background(), c, "attacker")
	return c
}
