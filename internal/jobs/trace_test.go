package jobs

import (
	"strings"
	"testing"
	"time"
)

func TestTraceParent(t *testing.T) {
	tp := TraceParent("01JOB")
	if len(tp) != 55 || tp[:3] != "00-" || tp[len(tp)-3:] != "-01" {
		t.Fatalf("traceparent %q is not W3C form", tp)
	}
	if TraceParent("01JOB") != tp || TraceParent("01JOC") == tp {
		t.Fatal("traceparent must be stable per job and differ between jobs")
	}
	if !ValidTraceParent(tp) {
		t.Fatalf("derived traceparent %q is not valid", tp)
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

// TestValidTraceParentHostile feeds the validator what a hostile client might
// send as a traceparent header or _meta.traceparent.
func TestValidTraceParentHostile(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if !ValidTraceParent(good) || !ValidTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") {
		t.Fatal("valid traceparents refused")
	}
	for name, bad := range map[string]string{
		"empty":              "",
		"upper case":         "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
		"version ff":         "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"future version":     "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"extra field":        good + "-00",
		"trailing space":     good + " ",
		"leading space":      " " + good[:54],
		"newline":            good[:54] + "\n",
		"zero trace id":      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"zero parent id":     "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"short trace id":     "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-001",
		"wrong separators":   "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
		"non-hex":            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01"[:55],
		"non-hex flags":      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
		"unicode":            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b-01",
		"NUL":                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\x00",
		"huge":               strings.Repeat("0", 1<<20),
		"header injection":   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX-Evil: 1",
		"sign in hex":        "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"dashes only":        strings.Repeat("-", 55),
		"separator shifted":  "00-4bf92f3577b34da6a3ce929d0e0e47360-0f067aa0ba902b7-01",
		"missing parent-id":  "00-4bf92f3577b34da6a3ce929d0e0e4736--01",
		"valid but prefixed": "x" + good[1:],
	} {
		if ValidTraceParent(bad) {
			t.Errorf("%s: %q accepted", name, bad)
		}
		if TraceID(bad) != "" {
			t.Errorf("%s: TraceID(%q) not empty", name, bad)
		}
	}
}

func FuzzValidTraceParent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidTraceParent(s) {
			return
		}
		// Whatever passes is safe to put in a header, a log line or a span.
		if len(s) != 55 || strings.ContainsFunc(s, func(r rune) bool { return !strings.ContainsRune("0123456789abcdef-", r) }) {
			t.Fatalf("accepted %q", s)
		}
	})
}

func TestNormalizeRefusesBadTraceParent(t *testing.T) {
	j := &Job{Code: "print(1)", TraceParent: "00-ZZ"}
	if err := j.Normalize(DefaultLimits(), time.Now()); err == nil || !strings.Contains(err.Error(), "traceparent") {
		t.Fatalf("Normalize = %v, want a traceparent error", err)
	}
	j = &Job{ID: "a", Code: "print(1)", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	if err := j.Normalize(DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	rec, _ := Apply(nil, Event{Job: j.ID, Kind: EventSubmitted, Spec: j, At: time.Now()})
	if rec.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("record trace id %q", rec.TraceID)
	}
	rec, _ = Apply(nil, Event{Job: "other", Kind: EventSubmitted, Spec: &Job{ID: "other"}, At: time.Now()})
	if rec.TraceID != TraceID(TraceParent("other")) {
		t.Fatalf("record without traceparent: trace id %q, want the derived one", rec.TraceID)
	}
}
