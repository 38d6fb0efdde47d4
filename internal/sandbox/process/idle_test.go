package process_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
)

// cpuTime is the CPU time process pid has used (user and system), from
// /proc/PID/stat in clock ticks of 10 ms.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.Atoi(f[11])
	stime, err2 := strconv.Atoi(f[12])
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// TestSupervisorWaitsIdleForAnEndedChannel: once an executor's channel has
// ended, the supervisor waits for the zygote to report its exit without
// watching the channel (a socket at its end is always readable: watched, it
// kept the supervisor spinning for as long as the process took to exit,
// about a millisecond of CPU a job, taken from the job that runs next). The
// code here closes its channel and lives on for a second.
func TestSupervisorWaitsIdleForAnEndedChannel(t *testing.T) {
	rr := startRaw(t)
	before := cpuTime(t, rr.pid)
	code := "import os, time\nos.closerange(3, 4096)\ntime.sleep(1)"
	if err := rr.w.Write(&proxy.Frame{Type: proxy.TypeExec, Job: "a", Code: code, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	_, done := rr.until(t)
	if done.Status == "success" {
		t.Fatalf("done %+v: want the job failed, its channel closed before its done", done)
	}
	if used := cpuTime(t, rr.pid) - before; used > 300*time.Millisecond {
		t.Fatalf("the supervisor used %v of CPU while the code, its channel closed, slept 1 s: it spun", used)
	}
}
