package errs_test

import (
	"errors"
	"fmt"
	"testing"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/errs"
)

type invalid struct{}

func (invalid) Error() string      { return "bad field" }
func (invalid) ErrKind() errs.Kind { return errs.Invalid }

func TestKindOf(t *testing.T) {
	notFound := errs.New(errs.NotFound, "not found")
	unavailable := errs.New(errs.Unavailable, "the broker is unreachable")
	for _, c := range []struct {
		err  error
		want errs.Kind
	}{
		{nil, errs.Internal},
		{errors.New("plain"), errs.Internal},
		{notFound, errs.NotFound},
		{fmt.Errorf("look up job x: %w", notFound), errs.NotFound},
		{fmt.Errorf("%w: %w", unavailable, errors.New("timeout")), errs.Unavailable},
		{&errs.Error{Kind: errs.Conflict, Msg: "version", Err: notFound}, errs.Conflict},
		{fmt.Errorf("job 3: %w", invalid{}), errs.Invalid},
	} {
		if got := errs.KindOf(c.err); got != c.want {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
	wrapped := fmt.Errorf("get: %w", notFound)
	if !errors.Is(wrapped, notFound) || errors.Is(wrapped, errs.New(errs.NotFound, "not found")) {
		t.Fatal("sentinels match by identity")
	}
	e := &errs.Error{Kind: errs.Unavailable, Msg: "state", Err: errors.New("no responders")}
	if e.Error() != "state: no responders" || errs.Kind(99).String() != "internal" || errs.QueueFull.String() != "queue_full" {
		t.Fatalf("%q", e.Error())
	}
}

// TestClipAndCut: both keep at most n bytes of s, cut at a character
// boundary; Clip marks the cut with "…", Cut does not. One table serves
// both.
func TestClipAndCut(t *testing.T) {
	for _, tc := range []struct {
		s         string
		n         int
		clip, cut string
	}{
		{"short", 10, "short", "short"},
		{"exactly", 7, "exactly", "exactly"},
		{"abcdef", 3, "abc…", "abc"},
		{"héllo", 2, "h…", "h"}, // é is two bytes: not split
		{"日本語", 4, "日…", "日"},
		{"日本語", 0, "…", ""},
	} {
		if got := errs.Clip(tc.s, tc.n); got != tc.clip || !utf8.ValidString(got) {
			t.Errorf("errs.Clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.clip)
		}
		if got := errs.Cut(tc.s, tc.n); got != tc.cut || !utf8.ValidString(got) {
			t.Errorf("errs.Cut(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.cut)
		}
	}
}
