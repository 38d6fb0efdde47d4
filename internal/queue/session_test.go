package queue

import (
	"regexp"
	"testing"
)

func TestSessionKey(t *testing.T) {
	kvKey := regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)
	tests := []struct{ ns, session, want string }{
		{"", "s1", "=.s1"},
		{"team-a", "s1", "team-a.s1"},
		{"a.b", "s1", "=612e62.s1"},
		{"ünï code", "x", "=c3bc6ec3af20636f6465.x"},
		{"_", "s1", "_.s1"},
	}
	for _, tt := range tests {
		got := SessionKey(tt.ns, tt.session)
		if got != tt.want || !kvKey.MatchString(got) {
			t.Errorf("SessionKey(%q, %q) = %q, want %q (a valid key)", tt.ns, tt.session, got, tt.want)
		}
	}
	if SessionKey("a", "b.c") == SessionKey("a.b", "c") {
		t.Error("different namespaces and sessions share a key")
	}
}
