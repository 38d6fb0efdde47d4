package sandbox

import "testing"

func TestParsePreload(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		bad  bool
	}{
		{"", 0, false},
		{"none", 0, false},
		{"numpy, pandas,matplotlib.pyplot", 3, false},
		{"numpy,,pandas", 2, false},
		{"os;rm -rf /", 0, true},
		{"--reset", 0, true},
		{"a..b", 0, true},
		{"1numpy", 0, true},
		{"numpy,über", 0, true},
	} {
		mods, err := ParsePreload(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && len(mods) != tc.want) {
			t.Errorf("ParsePreload(%q) = %q, %v; want %d modules, error %v", tc.in, mods, err, tc.want, tc.bad)
		}
	}
	if err := CheckPreload(DefaultPreload); err != nil {
		t.Fatal(err)
	}
}
