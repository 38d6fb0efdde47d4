package audit_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/audit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDigestRedactsNamesAndPatterns(t *testing.T) {
	t.Parallel()
	x, err := audit.Redaction{Names: []string{"ssn"}, Patterns: []string{`ghp_[A-Za-z0-9]{8,}`}}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]any{
		"query":      "note ghp_abcdefgh1234 in text",
		"password":   "hunter2",
		"X-Api-Key":  "k1",
		"max_tokens": 100.0,
		"nested":     []any{map[string]any{"github_token": "t1", "SSN": "123", "ok": "visible"}},
	}
	var e audit.Entry
	x.Digest(&e, args)
	for _, secret := range []string{"hunter2", "k1", "t1", "123", "ghp_abcdefgh1234"} {
		if strings.Contains(e.Args, secret) {
			t.Errorf("preview %s shows %q", e.Args, secret)
		}
	}
	for _, shown := range []string{"visible", `"max_tokens":100`, "note [redacted] in text"} {
		if !strings.Contains(e.Args, shown) {
			t.Errorf("preview %s lacks %q", e.Args, shown)
		}
	}
	if args["password"] != "hunter2" {
		t.Fatal("Digest changed the caller's arguments")
	}
	full, _ := audit.Canonical(args)
	if e.ArgsBytes != len(full) || len(e.ArgsSHA256) != 64 || e.ArgsClipped {
		t.Fatalf("digest fields: %+v", e)
	}
	// The same arguments digest the same, whatever the map's order.
	var e2 audit.Entry
	audit.DefaultRedactor.Digest(&e2, map[string]any{"nested": args["nested"], "max_tokens": 100.0, "X-Api-Key": "k1", "password": "hunter2", "query": args["query"]})
	if e2.ArgsSHA256 != e.ArgsSHA256 {
		t.Fatal("canonical digest depends on key order")
	}
}

func TestDigestOfTenMegabytesKeepsOneKiB(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("é", 5<<20) // 10 MiB of two-byte runes
	var e audit.Entry
	audit.DefaultRedactor.Digest(&e, map[string]any{"blob": big, "token": "s3cret"})
	if len(e.Args) > audit.PreviewBytes || !e.ArgsClipped || e.ArgsBytes < 10<<20 {
		t.Fatalf("preview %d bytes, clipped %v, args %d bytes", len(e.Args), e.ArgsClipped, e.ArgsBytes)
	}
	if !strings.HasPrefix(e.Args, `{"blob":"é`) {
		t.Fatalf("preview starts %q", e.Args[:20])
	}
	data, _ := json.Marshal(e)
	if len(data) > 4<<10 {
		t.Fatalf("entry is %d bytes", len(data))
	}
}

func TestRedactionValidate(t *testing.T) {
	t.Parallel()
	for _, r := range []audit.Redaction{
		{Patterns: []string{"("}},
		{Patterns: []string{strings.Repeat("a", audit.MaxPatternBytes+1)}},
		{Patterns: make([]string, audit.MaxPatterns+1)},
	} {
		if r.Validate() == nil {
			t.Errorf("%v accepted", r)
		}
	}
}

func TestProof(t *testing.T) {
	t.Parallel()
	key := audit.Key([]byte("fleet proxy key"))
	e := audit.Entry{JobID: "j", Namespace: "ns", Server: "s", Tool: "t", Decision: audit.DecisionAllow, At: time.Now().UTC()}
	audit.Sign(key, &e)
	if !audit.Check(key, e) {
		t.Fatal("signed entry does not check")
	}
	forged := e
	forged.Tool = "delete_everything"
	if audit.Check(key, forged) {
		t.Fatal("altered entry checks")
	}
	if audit.Check(audit.Key([]byte("another key")), e) {
		t.Fatal("entry checks under another key")
	}
}

func chain(t *testing.T, n int) []audit.Record {
	t.Helper()
	var out []audit.Record
	for i := range n {
		data, _ := json.Marshal(audit.Entry{ID: string(rune('a' + i)), Namespace: "ns", Tool: "t"})
		var last *audit.Record
		if len(out) > 0 {
			last = &out[len(out)-1]
		}
		out = append(out, audit.Next(last, audit.Genesis, uint64(10+i), data))
	}
	return out
}

func verify(recs []audit.Record, head audit.Record) error {
	v := audit.NewVerifier("ns", audit.Genesis, 1)
	for _, r := range recs {
		if err := v.Add(r); err != nil {
			return err
		}
	}
	return v.End(head.Hash, head.Index)
}

func TestVerifyNamesTheBrokenEntry(t *testing.T) {
	t.Parallel()
	recs := chain(t, 5)
	head := recs[4]
	if err := verify(recs, head); err != nil {
		t.Fatal(err)
	}
	brokenAt := func(recs []audit.Record) uint64 {
		var b *audit.BrokenError
		if err := verify(recs, head); !errors.As(err, &b) {
			t.Fatalf("verify = %v, want a BrokenError", err)
		}
		return b.Index
	}
	altered := append([]audit.Record(nil), recs...)
	altered[2].Entry = json.RawMessage(strings.Replace(string(altered[2].Entry), `"t"`, `"u"`, 1))
	if got := brokenAt(altered); got != 3 {
		t.Errorf("altered entry 3: named %d", got)
	}
	removed := append(append([]audit.Record(nil), recs[:1]...), recs[2:]...)
	if got := brokenAt(removed); got != 2 {
		t.Errorf("removed entry 2: named %d", got)
	}
	if got := brokenAt(recs[:4]); got != 5 && got != 4 {
		t.Errorf("removed last entry: named %d", got)
	}
	// Rehashing the altered entry alone breaks the next one.
	rehashed := append([]audit.Record(nil), altered...)
	rehashed[2].Hash = audit.Link(rehashed[2].Prev, 3, rehashed[2].Seq, rehashed[2].Entry)
	if got := brokenAt(rehashed); got != 4 {
		t.Errorf("rehashed entry 3: named %d", got)
	}
}
