package queue_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

func TestDecodeOutputRefuses(t *testing.T) {
	t.Parallel()
	good := jobs.OutputChunk{Stream: "stdout", Data: "hi\n", Attempt: 1, Seq: 1, Proof: "p"}
	data, err := queue.EncodeOutput(good)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := queue.DecodeOutput(data); err != nil || got != good {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for name, frame := range map[string]string{
		"oversized":    `{"stream":"stdout","data":"` + strings.Repeat("x", queue.MaxOutputFrame) + `","attempt":1,"seq":1,"proof":"p"}`,
		"not json":     "\xff\xfe",
		"array":        `[1]`,
		"other stream": `{"stream":"stdin","data":"x","attempt":1,"seq":1,"proof":"p"}`,
		"no data":      `{"stream":"stdout","data":"","attempt":1,"seq":1,"proof":"p"}`,
		"attempt 0":    `{"stream":"stdout","data":"x","attempt":0,"seq":1,"proof":"p"}`,
		"seq 0":        `{"stream":"stdout","data":"x","attempt":1,"proof":"p"}`,
		"no proof":     `{"stream":"stdout","data":"x","attempt":1,"seq":1}`,
		"wrong types":  `{"stream":1,"data":"x","attempt":"1","seq":1,"proof":"p"}`,
	} {
		if _, err := queue.DecodeOutput([]byte(frame)); !errors.Is(err, queue.ErrMalformed) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	if _, err := queue.EncodeOutput(jobs.OutputChunk{Stream: "stdout", Data: strings.Repeat("x", queue.MaxOutputData+1)}); err == nil {
		t.Error("encoded a chunk over MaxOutputData")
	}
}

func TestSplitOutput(t *testing.T) {
	t.Parallel()
	for name, data := range map[string]string{
		"short":     "hello",
		"ascii":     strings.Repeat("a", 3*queue.MaxOutputData+5),
		"multibyte": strings.Repeat("é€😀", queue.MaxOutputData/3),
		"binary":    strings.Repeat("\x80", 2*queue.MaxOutputData+1),
	} {
		pieces := queue.SplitOutput(data)
		if strings.Join(pieces, "") != data {
			t.Fatalf("%s: pieces do not join to the data", name)
		}
		for i, p := range pieces {
			if len(p) == 0 || len(p) > queue.MaxOutputData {
				t.Fatalf("%s: piece %d of %d bytes", name, i, len(p))
			}
			if utf8.ValidString(data) && !utf8.ValidString(p) {
				t.Fatalf("%s: piece %d cuts a character", name, i)
			}
			// Even all-escaped data fits a frame.
			c := jobs.OutputChunk{Stream: "stderr", Data: p, Attempt: 1, Seq: 1, Proof: "p"}
			if enc, err := queue.EncodeOutput(c); err != nil || len(enc) > queue.MaxOutputFrame {
				t.Fatalf("%s: piece %d encodes to %d bytes: %v", name, i, len(enc), err)
			}
		}
	}
	if enc, err := queue.EncodeOutput(jobs.OutputChunk{Stream: "stderr", Data: strings.Repeat("\x01", queue.MaxOutputData), Attempt: 1, Seq: 1, Proof: "p"}); err != nil || len(enc) > queue.MaxOutputFrame {
		t.Fatalf("control characters: %d bytes, %v", len(enc), err)
	}
}

func TestDecodeCancelRefuses(t *testing.T) {
	t.Parallel()
	data, err := queue.EncodeCancel(queue.Cancel{Job: "j1", Reason: strings.Repeat("r", 2*queue.MaxCancelReason)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := queue.DecodeCancel("j1", data)
	if err != nil || c.Job != "j1" || len(c.Reason) > queue.MaxCancelReason {
		t.Fatalf("round trip: %+v %v", c, err)
	}
	if _, err := queue.EncodeCancel(queue.Cancel{Job: "a.b"}); err == nil {
		t.Error("encoded a cancel of an invalid job id")
	}
	for name, frame := range map[string]string{
		"raw reason (before named messages)": "cancelled through the jobs API",
		"empty":                              "",
		"another job":                        `{"job":"j2"}`,
		"no job":                             `{"reason":"x"}`,
		"oversized":                          `{"job":"j1","reason":"` + strings.Repeat("x", queue.MaxCancelFrame) + `"}`,
		"long reason":                        `{"job":"j1","reason":"` + strings.Repeat("x", queue.MaxCancelReason+1) + `"}`,
	} {
		if _, err := queue.DecodeCancel("j1", []byte(frame)); !errors.Is(err, queue.ErrMalformed) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

func TestDecodeSessionRequest(t *testing.T) {
	t.Parallel()
	for _, r := range []queue.SessionRequest{
		{Key: queue.SessionKey("team-a", "s1")},
		{Key: queue.SessionKey("a.b", "s1"), End: true},
		{Key: queue.SessionKey("", "s1")},
	} {
		got, err := queue.DecodeSessionRequest(r.Encode())
		if err != nil || got != r {
			t.Errorf("round trip of %+v: %+v %v", r, got, err)
		}
	}
	for name, frame := range map[string]string{
		"empty":      "",
		"end only":   queue.EndSessionRequest,
		"no session": "team-a",
		"wildcard":   "team-a.*",
		"three dots": "a.b.c",
		"oversized":  strings.Repeat("a", queue.MaxSessionRequest) + ".s1",
		"end twice":  queue.EndSessionRequest + queue.EndSessionRequest + "a.s1",
	} {
		if _, err := queue.DecodeSessionRequest([]byte(frame)); !errors.Is(err, queue.ErrMalformed) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	for _, a := range []queue.SessionAnswer{queue.SessionHeld, queue.SessionEnded, queue.SessionGone} {
		if got, err := queue.DecodeSessionAnswer([]byte(a)); err != nil || got != a {
			t.Errorf("answer %q: %q %v", a, got, err)
		}
	}
	if _, err := queue.DecodeSessionAnswer([]byte("held ")); err == nil {
		t.Error("decoded an answer with trailing junk")
	}
}

func TestDecodeSessionEntryRefuses(t *testing.T) {
	t.Parallel()
	for name, frame := range map[string]string{
		"not json":      "x",
		"no worker":     `{"session":"s1"}`,
		"bad worker":    `{"worker":"w 1","session":"s1"}`,
		"no session":    `{"worker":"w1"}`,
		"oversized":     `{"worker":"w1","session":"s1","proof":"` + strings.Repeat("p", queue.MaxSessionEntry) + `"}`,
		"wrong since":   `{"worker":"w1","session":"s1","since":3}`,
		"array at root": `[]`,
	} {
		if _, err := queue.DecodeSessionEntry([]byte(frame)); !errors.Is(err, queue.ErrMalformed) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}
