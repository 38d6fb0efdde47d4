package queue_test

import (
	"testing"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// FuzzDecodeOutput feeds output chunks as any worker host may publish them:
// DecodeOutput never panics, what it accepts is within its bounds, and it
// encodes and decodes to the same chunk again.
func FuzzDecodeOutput(f *testing.F) {
	good, err := queue.EncodeOutput(jobs.OutputChunk{Stream: "stdout", Data: "hi\n", Attempt: 1, Seq: 1, Proof: "p"})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{string(good), `{}`, `{"stream":"stderr","data":"\u0000","attempt":1,"seq":18446744073709551615,"proof":"x"}`,
		`{"stream":"stdout","data":"x","attempt":-1,"seq":1,"proof":"p"}`, `null`, "\xff"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := queue.DecodeOutput(data)
		if err != nil {
			return
		}
		if c.Stream != "stdout" && c.Stream != "stderr" || c.Data == "" || len(c.Data) > queue.MaxOutputData || c.Attempt < 1 || c.Seq < 1 || c.Proof == "" {
			t.Fatalf("accepted %+v", c)
		}
		again, err := queue.EncodeOutput(c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		c2, err := queue.DecodeOutput(again)
		if err != nil || c2 != c {
			t.Fatalf("round trip: %+v %v", c2, err)
		}
	})
}

// FuzzDecodeCancel feeds cancel announcements: DecodeCancel never panics and
// accepts only an announcement of the job whose subject it came on.
func FuzzDecodeCancel(f *testing.F) {
	good, err := queue.EncodeCancel(queue.Cancel{Job: "j1", Reason: "stop"})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{string(good), "stop", `{"job":"j2"}`, `{"job":"j1","reason":1}`, `null`, ""} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := queue.DecodeCancel("j1", data)
		if err != nil {
			return
		}
		if c.Job != "j1" || len(c.Reason) > queue.MaxCancelReason {
			t.Fatalf("accepted %+v", c)
		}
		again, err := queue.EncodeCancel(c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if c2, err := queue.DecodeCancel("j1", again); err != nil || c2 != c {
			t.Fatalf("round trip: %+v %v", c2, err)
		}
	})
}

// FuzzDecodeSessionRequest feeds session look-ups: what DecodeSessionRequest
// accepts is a session key, and encodes to the same request again.
func FuzzDecodeSessionRequest(f *testing.F) {
	for _, seed := range []string{"team-a.s1", "end:team-a.s1", "=612e62.s1", "end:", "a.*", "a..b", "end:end:a.b"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := queue.DecodeSessionRequest(data)
		if err != nil {
			return
		}
		if r.Key == "" || len(r.Key) > queue.MaxSessionRequest {
			t.Fatalf("accepted %+v", r)
		}
		if r2, err := queue.DecodeSessionRequest(r.Encode()); err != nil || r2 != r {
			t.Fatalf("round trip: %+v %v", r2, err)
		}
	})
}

// FuzzDecodeSessionEntry feeds sessions-bucket values as any worker host may
// write them: what DecodeSessionEntry accepts names a valid worker and
// session, and encodes to an entry that decodes the same.
func FuzzDecodeSessionEntry(f *testing.F) {
	for _, seed := range []string{`{"worker":"w1","session":"s1","since":"2026-01-02T03:04:05Z","proof":"p"}`,
		`{"worker":"w1","session":"s1","ended":true}`, `{"worker":"","session":"s1"}`, `{"since":"x"}`, `[]`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := queue.DecodeSessionEntry(data)
		if err != nil {
			return
		}
		if !jobs.ValidID(e.Worker) || !jobs.ValidID(e.Session) {
			t.Fatalf("accepted %+v", e)
		}
		again, err := e.Encode()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		e2, err := queue.DecodeSessionEntry(again)
		if err != nil || e2.Worker != e.Worker || e2.Session != e.Session || !e2.Since.Equal(e.Since) || e2.Ended != e.Ended || e2.Proof != e.Proof {
			t.Fatalf("round trip: %+v %v", e2, err)
		}
	})
}
