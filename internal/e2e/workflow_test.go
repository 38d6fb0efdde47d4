package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestWorkflowSurvivesFaults is issue 12's workflow test: a 100-job diamond
// (a root, 98 jobs after it, a join after all 98) on three clustered
// brokers and two workers running real Python runners. Each middle job reads
// the root's result with job_result; the join reads all 98. A broker and a
// worker are killed mid-workflow; every job still succeeds once, and the
// join saw every parent's result. A second workflow's failed parent skips
// exactly its descendants.
func TestWorkflowSurvivesFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster fault test")
	}
	q := faultQueue()
	q.AckWait, q.BackOff = 10*time.Second, nil
	c := testutil.StartCluster(t, 3, q)
	workerConns := processWorkers(t, c, 2, q)
	nc, err := nats.Connect(c.URL(), nats.Name("fe"), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	fe := testutil.FrontendOn(t, nc, "fe")
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}),
		mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{replicaToken: replicaNS}})}))
	t.Cleanup(hs.Close)

	const fan = 98
	diamond := jobsapi.WorkflowRequest{ID: "diamond", Jobs: []jobsapi.JobRequest{
		{ID: "root", Code: "print('root-out')", MaxAttempts: 3},
	}}
	var mids []string
	for i := range fan {
		id := fmt.Sprintf("mid-%02d", i)
		mids = append(mids, id)
		diamond.Jobs = append(diamond.Jobs, jobsapi.JobRequest{ID: id, After: []string{"root"}, MaxAttempts: 3, Timeout: 60,
			Code: fmt.Sprintf("import time\nr = job_result('root')\nassert r['status'] == 'success', r\ntime.sleep(0.3)\nprint(r['stdout'][0], %d)", i)})
	}
	diamond.Jobs = append(diamond.Jobs, jobsapi.JobRequest{ID: "join", After: mids, MaxAttempts: 3, Timeout: 60, Code: fmt.Sprintf(`total = 0
for i in range(%d):
    r = job_result("mid-%%02d" %% i)
    assert r["status"] == "success", r
    word, n = r["stdout"][0].split()
    assert word == "root-out", r
    total += int(n)
print(total)`, fan)})
	fails := jobsapi.WorkflowRequest{ID: "fails", Jobs: []jobsapi.JobRequest{
		{ID: "bad", Code: "raise SystemExit(3)"},
		{ID: "child", Code: "print('never')", After: []string{"bad"}},
		{ID: "grandchild", Code: "print('never')", After: []string{"child"}},
		{ID: "report", Code: "print(job_result('bad')['status'])", AfterAny: []string{"bad"}},
		{ID: "bystander", Code: "print('ran')"},
	}}
	for _, wf := range []jobsapi.WorkflowRequest{diamond, fails} {
		if status, body := apiDo(http.MethodPost, hs.URL+"/api/workflows", wf); status != http.StatusCreated {
			t.Fatalf("submit %s: %d %s", wf.ID, status, body)
		}
	}

	// Mid-workflow: a broker node and a worker die.
	deadline := time.Now().Add(60 * time.Second)
	for done := 0; done < 20; {
		wf := getWorkflow(t, hs.URL, "diamond")
		done = wf.Counts["success"]
		if time.Now().After(deadline) {
			t.Fatalf("the diamond did not get going: %v", wf.Counts)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Log("killing node2 and worker w1")
	c.Kill(2)
	workerConns[1].Close()

	var wf jobsapi.Workflow
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		wf = getWorkflow(t, hs.URL, "diamond")
		if wf.Status != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the diamond did not end: %v", wf.Counts)
		}
	}
	if wf.Status != "success" || wf.Counts["success"] != fan+2 || len(wf.Jobs) != fan+2 {
		for _, it := range wf.Jobs {
			if it.Status != jobs.StatusSuccess {
				t.Logf("%s: %s %+v", it.Job.ID, it.Status, it.Result)
			}
		}
		t.Fatalf("diamond %s %v", wf.Status, wf.Counts)
	}
	recs := map[string]*jobs.Record{}
	for _, it := range wf.Jobs {
		recs[it.Job.ID] = it.Record
	}
	if got, want := strings.TrimSpace(recs["join"].Result.Stdout), fmt.Sprint(fan*(fan-1)/2); got != want {
		t.Fatalf("join printed %q, want %s (the sum of the middle jobs' numbers)", got, want)
	}
	retried := 0
	for _, r := range recs {
		if r.Attempt > 1 {
			retried++
		}
	}
	t.Logf("diamond: %d jobs succeeded, %d of them on a second attempt after the worker died", len(recs), retried)

	var failed jobsapi.Workflow
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if failed = getWorkflow(t, hs.URL, "fails"); failed.Status != "running" || time.Now().After(deadline) {
			break
		}
	}
	got := map[string]string{}
	for _, it := range failed.Jobs {
		got[it.Job.ID] = string(it.Status)
		if it.Result != nil {
			got[it.Job.ID] += " " + strings.TrimSpace(it.Result.Stdout+it.Result.Error)
		}
	}
	want := map[string]string{"bad": "error", "child": "skipped parent bad ended error", "grandchild": "skipped parent child ended skipped",
		"report": "success error", "bystander": "success ran"}
	for id, w := range want {
		if !strings.HasPrefix(got[id], w) {
			t.Errorf("%s: %q, want %q", id, got[id], w)
		}
	}
}

func getWorkflow(t *testing.T, url, id string) jobsapi.Workflow {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		status, body := apiDo(http.MethodGet, url+"/api/workflows/"+id, nil)
		var wf jobsapi.Workflow
		if status == http.StatusOK && json.Unmarshal(body, &wf) == nil {
			return wf
		}
		if time.Now().After(deadline) {
			t.Fatalf("get workflow %s: %d %s", id, status, body)
		}
	}
}
