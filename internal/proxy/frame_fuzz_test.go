package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func frameBytes(body string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// FuzzDecodeFrame: any body either decodes into a frame that passes validation
// and survives a round trip, or is refused with ErrBadFrame; it never panics.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"hello","version":1}`,
		`{"type":"out","stream":"stdout","data":"42\n"}`,
		`{"type":"out","stream":"stdin","data":"x"}`,
		`{"type":"call","id":1,"method":"call_tool","params":{"server":"s","tool":"t","arguments":{}}}`,
		`{"type":"call","id":0,"method":"x"}`,
		`{"type":"reply","id":7,"result":{"a":[1,2]}}`,
		`{"type":"done","status":"success","exit_code":0}`,
		`{"type":"done","status":"error","exit_code":-1,"error":"\ud800"}`,
		`{"type":"exec","job":"j","code":"print(1)","servers":["a"],"timeout_ms":1000,"output_cap":4096}`,
		`{"type":"out","stream":"stdout","data":"\u0000\uffff","type":"done"}`,
		`{"id":18446744073709551615,"type":"reply"}`,
		`{"id":-1,"type":"reply"}`,
		`{"type":"call","id":1e3,"method":"m"}`,
		`[]`, `null`, `"type"`, `{`, "", "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, err := DecodeFrame(body)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v does not wrap ErrBadFrame", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := NewWriter(&buf, 0).Write(fr); err != nil {
			t.Fatalf("re-encode %+v: %v", fr, err)
		}
		again, err := NewReader(&buf, 0).Read()
		if err != nil {
			t.Fatalf("a valid frame %+v did not survive a round trip: %v", fr, err)
		}
		if again.Type != fr.Type || again.ID != fr.ID || again.Stream != fr.Stream || again.Data != fr.Data {
			t.Fatalf("round trip changed the frame: %+v -> %+v", fr, again)
		}
	})
}

// FuzzReader: a stream of arbitrary bytes yields frames, then an error; it never
// panics, never allocates beyond the limit and never reads past a refused header.
func FuzzReader(f *testing.F) {
	f.Add(frameBytes(`{"type":"hello","version":1}`), 64)
	f.Add(append(frameBytes(`{"type":"out","stream":"stderr","data":"e"}`), frameBytes(`{"type":"done","status":"success"}`)...), 1024)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 'x'}, 1<<20)
	f.Add([]byte{0, 0, 0, 10, '{', '}'}, 16)
	f.Add([]byte{0, 0}, 16)
	f.Add(frameBytes(`{"type":"exec","code":"`+string(make([]byte, 100))+`"}`), 32)
	f.Fuzz(func(t *testing.T, data []byte, max int) {
		if max <= 0 || max > 1<<20 {
			max = 1 << 16
		}
		r := NewReader(bytes.NewReader(data), max)
		for i := 0; ; i++ {
			fr, err := r.Read()
			if err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrBadFrame) || errors.Is(err, ErrFrameTooLarge) {
					return
				}
				t.Fatalf("unexpected error kind: %v", err)
			}
			if fr == nil || i > len(data) {
				t.Fatalf("frame %d: %+v", i, fr)
			}
		}
	})
}
