package jobs

import "testing"

func TestTraceParent(t *testing.T) {
	tp := TraceParent("01JOB")
	if len(tp) != 55 || tp[:3] != "00-" || tp[len(tp)-3:] != "-01" {
		t.Fatalf("traceparent %q is not W3C form", tp)
	}
	if TraceParent("01JOB") != tp || TraceParent("01JOC") == tp {
		t.Fatal("traceparent must be stable per job and differ between jobs")
	}
	if id := TraceID(tp); id != tp[3:35] {
		t.Fatalf("TraceID(%q) = %q", tp, id)
	}
	for _, bad := range []string{"", "00-xyz-1-01", "00-" + string(make([]byte, 32)) + "-0000000000000000-01"} {
		if TraceID(bad) != "" {
			t.Errorf("TraceID(%q) accepted", bad)
		}
	}
}
