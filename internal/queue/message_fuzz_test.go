package queue_test

import (
	"testing"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// FuzzDecodeMessage feeds job messages as a compromised node might publish
// them: DecodeMessage never panics, refuses what is not a job with a valid
// id, and what it accepts encodes and decodes to the same job again.
func FuzzDecodeMessage(f *testing.F) {
	good, err := queue.EncodeMessage(&jobs.Job{ID: "j1", Code: "print(1)", Namespace: "a", Session: "s"}, "cap")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{
		good,
		[]byte(`{}`),
		[]byte(`{"id":""}`),
		[]byte(`{"id":"../etc"}`),
		[]byte(`{"id":"j","timeout":-1,"max_attempts":1e9}`),
		[]byte(`{"id":"j","labels":{"":"x"},"after":["a","a"]}`),
		[]byte(`[1,2]`),
		[]byte(`null`),
		[]byte("\xff\xfe"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := queue.DecodeMessage(data)
		if err != nil {
			return
		}
		if !jobs.ValidID(m.ID) {
			t.Fatalf("accepted invalid id %q", m.ID)
		}
		again, err := queue.EncodeMessage(&m.Job, m.Capability)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		m2, err := queue.DecodeMessage(again)
		if err != nil || m2.ID != m.ID || m2.Code != m.Code || m2.Namespace != m.Namespace || m2.Capability != m.Capability {
			t.Fatalf("round trip: %+v %v", m2, err)
		}
	})
}
