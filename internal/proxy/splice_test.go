package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

// TestSplicedIsTheEncoding: a frame, request or response encoded with its
// raw JSON spliced in decodes to what encoding/json's encoding of it
// decodes to, with and without raw fields, and with nothing else set.
func TestSplicedIsTheEncoding(t *testing.T) {
	raw := json.RawMessage(`{"content":[{"type":"text","text":"<b>x</b> & y"}],"n":[1,2.5,null]}`)
	for _, v := range []any{
		&Frame{Type: TypeReply, ID: 7, Result: raw},
		&Frame{Type: TypeReply, ID: 8, Error: "no"},
		&Frame{Type: TypeCall, ID: 9, Method: MethodCallTool, Params: raw},
		&Frame{Type: TypeCall, ID: 9, Method: MethodCallTool, Params: raw, Result: json.RawMessage(`"both"`)},
		&Request{Job: "j", Attempt: 2, Capability: "c", Method: MethodCallTool, Params: raw, CallID: "k", Parks: true},
		&Request{Job: "j", Method: MethodListServers},
		&Response{Result: raw},
		&Response{Result: json.RawMessage(`null`)},
		&Response{Error: "failed"},
		&Response{},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		switch x := v.(type) {
		case *Frame:
			var buf bytes.Buffer
			if err := NewWriter(&buf, 0).Write(x); err != nil {
				t.Fatal(err)
			}
			got = buf.Bytes()[4:]
		case *Request:
			got, err = x.encode()
		case *Response:
			got, err = x.encode()
		}
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		if err := json.Unmarshal(want, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &b); err != nil {
			t.Fatalf("%T: spliced %s is not JSON: %v", v, got, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%T: spliced %s, encoding/json %s", v, got, want)
		}
	}
}

// TestParamsAndResultGoAsTheyCame: a call's parameters reach the responder
// byte for byte as the worker had them, and the result reaches the caller
// byte for byte as the handler answered it: neither is encoded again on
// the way (encoding/json would have compacted the spaces and escaped <).
func TestParamsAndResultGoAsTheyCame(t *testing.T) {
	nc := natstest.Conn(t)
	params := json.RawMessage(`{ "server": "ts",  "tool": "echo", "arguments": {"text": "<x>"} }`)
	result := json.RawMessage(`{"content": [ {"type": "text", "text": "<y> & z"} ]}`)
	got := make(chan json.RawMessage, 1)
	r := NewResponder(nc, "", HandlerFunc(func(_ context.Context, req Request) (json.RawMessage, error) {
		got <- req.Params
		return result, nil
	}))
	if err := r.Start("splice.test"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(time.Second) })
	for _, parks := range []bool{false, true} {
		res, err := Call(context.Background(), nc, "splice.test", Request{Job: "j", Method: MethodCallTool, Params: params, Parks: parks})
		if err != nil {
			t.Fatal(err)
		}
		if p := <-got; !bytes.Equal(p, params) {
			t.Fatalf("parks %v: the responder got params %s, sent %s", parks, p, params)
		}
		if !bytes.Equal(res, result) {
			t.Fatalf("parks %v: the caller got %s, answered %s", parks, res, result)
		}
		var buf bytes.Buffer
		if err := NewWriter(&buf, 0).Write(&Frame{Type: TypeReply, ID: 1, Result: res}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(buf.Bytes(), result) {
			t.Fatalf("reply frame %s does not carry the result as it came", buf.Bytes())
		}
	}
}
