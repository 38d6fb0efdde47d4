package process_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// slowHost answers every call_tool after delay, with the text "ok".
type slowHost struct{ delay time.Duration }

func (h slowHost) Call(ctx context.Context, method string, _ json.RawMessage) (json.RawMessage, error) {
	if method != "call_tool" {
		return json.RawMessage(`[]`), nil
	}
	select {
	case <-time.After(h.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return json.RawMessage(`{"content":[{"type":"text","text":"ok"}]}`), nil
}

func (slowHost) Output(string, string) {}

// countDuring runs code that awaits three 200 ms tool calls one after the
// other while the event loop has other work, set up by setup, which notes
// the time in the list n each time it runs; it returns how many of those
// runs came while a call was waiting (not after it returned).
func countDuring(t *testing.T, setup string) int {
	t.Helper()
	code := `import asyncio, time
n = []
` + setup + `
await asyncio.sleep(0.01)
calls = []
for _ in range(3):
    t0 = time.monotonic()
    assert await call_tool("GitHub", "slow", {}) == "ok"
    calls.append((t0, time.monotonic()))
print(sum(1 for x in n if any(t0 < x < t1 - 0.002 for t0, t1 in calls)))
`
	res := runWith(t, slowHost{delay: 200 * time.Millisecond}, code)
	got, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil {
		t.Fatalf("output %q: %v", res.Stdout, err)
	}
	return got
}

// TestLoneCallKeepsTimers: a call that is all the loop waits for may read
// its reply without going round the loop, but never past the loop's next
// timer. A task ticking every 20 ms ticks through three 200 ms calls.
func TestLoneCallKeepsTimers(t *testing.T) {
	t.Parallel()
	got := countDuring(t, `async def tick():
    while True:
        n.append(time.monotonic())
        await asyncio.sleep(0.02)
ticker = asyncio.create_task(tick())`)
	if got < 10 { // about 30; the bound is loose for a loaded machine
		t.Fatalf("the ticker ticked %d times during 600 ms of calls", got)
	}
}

// lateDuring runs code that awaits three 200 ms tool calls one after the
// other while setup has the loop run other work, which notes in the list
// late how long each piece of it waited to run; it fails the test unless
// more than ten pieces ran and none waited over 100 ms (what waited, per
// what).
func lateDuring(t *testing.T, what, setup string) {
	t.Helper()
	res := runWith(t, slowHost{delay: 200 * time.Millisecond}, `import asyncio, threading, time
late = []
loop = asyncio.get_running_loop()
`+setup+`
for _ in range(3):
    assert await call_tool("GitHub", "slow", {}) == "ok"
print(len(late) > 10, sum(1 for d in late if d > 0.1))
`)
	if strings.TrimSpace(res.Stdout) != "True 0" {
		t.Fatalf("ran, and %s that waited over 100 ms: %q", what, res.Stdout)
	}
}

// TestLoneCallKeepsThreadsafeCallbacks: callbacks another thread schedules
// with call_soon_threadsafe run while a lone call waits, not after it: none
// waits anywhere near a call's 200 ms.
func TestLoneCallKeepsThreadsafeCallbacks(t *testing.T) {
	t.Parallel()
	lateDuring(t, "callbacks", `def feed():
    for _ in range(100):
        loop.call_soon_threadsafe(lambda s=time.monotonic(): late.append(time.monotonic() - s))
        time.sleep(0.005)
threading.Thread(target=feed, daemon=True).start()`)
}

// TestLoneCallKeepsReaders: a reader the code added to the loop (here a
// pipe another thread writes to) is served while a lone call waits.
func TestLoneCallKeepsReaders(t *testing.T) {
	t.Parallel()
	lateDuring(t, "reads", `import os, struct
r, w = os.pipe()
def readable():
    late.append(time.monotonic() - struct.unpack("d", os.read(r, 8))[0])
loop.add_reader(r, readable)
def feed():
    for _ in range(100):
        os.write(w, struct.pack("d", time.monotonic()))
        time.sleep(0.005)
threading.Thread(target=feed, daemon=True).start()`)
}

// TestLoneCallsConcurrent: calls gathered at once still overlap (the host
// answers each after 100 ms: ten in a row would take a second).
func TestLoneCallsConcurrent(t *testing.T) {
	t.Parallel()
	res := runWith(t, slowHost{delay: 100 * time.Millisecond}, `import asyncio, time
start = time.monotonic()
got = await asyncio.gather(*[call_tool("GitHub", "slow", {}) for _ in range(10)])
print(got == ["ok"] * 10, time.monotonic() - start < 0.6)
`)
	if strings.TrimSpace(res.Stdout) != "True True" {
		t.Fatalf("output %q", res.Stdout)
	}
}
