package sandboxflags

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512m": 512 << 20, "1g": 1 << 30, "65536k": 64 << 20, "1024": 1024, " 2G ": 2 << 30, "0": 0} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "m", "-1", "1t", "1.5g", "lots"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("%q was accepted", in)
		}
	}
}
