package app_test

import (
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestRunPythonThroughFleet sends run_python through broker, worker and front-end
// as separate components joined over TCP NATS, with the process runtime.
func TestRunPythonThroughFleet(t *testing.T) {
	qcfg := queue.DefaultConfig()
	b := testutil.Broker(t, "", qcfg)
	rt := testutil.ProcessRuntime(t)
	wcfg := worker.DefaultConfig("w1")
	testutil.Worker(t, b, rt, wcfg)
	fe := testutil.Frontend(t, b, "fe1")
	c := testutil.MCPClient(t, fe)

	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(6*7)"})
	if res.IsError || strings.TrimSpace(testutil.Text(res)) != "42" {
		t.Fatalf("result isError=%v text=%q", res.IsError, testutil.Text(res))
	}
	st := testutil.Structured(t, res)
	if st.Status != "success" || len(st.Stdout) != 1 || st.Stdout[0] != "42" || st.JobID == "" {
		t.Fatalf("structured %+v", st)
	}
	// The broker recorded the final result in bbolt.
	rec := testutil.WaitRecord(t, b, st.JobID, jobs.StatusSuccess)
	if rec.Result.Stdout != "42\n" || rec.Worker != "w1" || rec.Attempt != 1 {
		t.Fatalf("record %+v result %+v", rec, rec.Result)
	}

	t.Run("ErrorResult", func(t *testing.T) {
		res := testutil.CallRunPython(t, c, map[string]any{"code": "raise ValueError('boom')"})
		st := testutil.Structured(t, res)
		if !res.IsError || st.Status != "error" || !strings.Contains(testutil.Text(res), "ValueError: boom") || !strings.Contains(testutil.Text(res), "status: error") {
			t.Fatalf("isError=%v text=%q", res.IsError, testutil.Text(res))
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		res := testutil.CallRunPython(t, c, map[string]any{"code": "import time\ntime.sleep(30)", "timeout": 1})
		st := testutil.Structured(t, res)
		if !res.IsError || st.Status != "timeout" || st.TimeoutSeconds != 1 {
			t.Fatalf("isError=%v structured=%+v", res.IsError, st)
		}
	})
}

// TestBadInputNeverReachesWorker checks each malformed call gets a clear error and
// that no job is submitted for any of them.
func TestBadInputNeverReachesWorker(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	fe := testutil.Frontend(t, b, "fe1")
	c := testutil.MCPClient(t, fe) // no worker: a submitted job would hang the call

	cases := []struct {
		name string
		args map[string]any
		want string
	}{
		{"MissingCode", map[string]any{}, "code is required"},
		{"EmptyCode", map[string]any{"code": ""}, "code is required"},
		{"CodeNotString", map[string]any{"code": 5}, "arguments do not match"},
		{"FractionalTimeout", map[string]any{"code": "print(1)", "timeout": 1.5}, "not a whole number"},
		{"StringTimeout", map[string]any{"code": "print(1)", "timeout": "ten"}, "not a whole number"},
		{"TimeoutTooLong", map[string]any{"code": "print(1)", "timeout": 100000}, "outside 1..120"},
		{"TimeoutZero", map[string]any{"code": "print(1)", "timeout": 0}, "less than 1"},
		{"OversizedCode", map[string]any{"code": strings.Repeat("#", 256<<10+1)}, "over the limit of 262144 bytes"},
		{"BadSession", map[string]any{"code": "print(1)", "session": "a b"}, "invalid session"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := testutil.CallRunPython(t, c, tc.args)
			if !res.IsError || !strings.Contains(testutil.Text(res), tc.want) {
				t.Fatalf("isError=%v text=%q, want error containing %q", res.IsError, testutil.Text(res), tc.want)
			}
		})
	}
	js := testutil.Connect(t, b, "check")
	client, err := queue.NewClient(js, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := client.JetStream().Stream(t.Context(), jobs.Subjects{}.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d jobs reached the queue from bad input", n)
	}
}
