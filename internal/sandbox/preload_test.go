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

// TestDataExpectation: a runtime expects jobs that use the data stack after
// one came (Python code naming a preloaded module's top-level name as a
// word, as the supervisor routes it), and never without preload modules.
func TestDataExpectation(t *testing.T) {
	e := NewDataExpectation(DefaultPreload)
	for _, job := range []Job{
		{Code: "print(1)"},
		{Code: "import pandasql\nmy_numpy_thing = 1"},
		{Code: "import pandas", Language: JavaScript},
	} {
		e.Saw(job)
		if e.Expected() {
			t.Fatalf("after %q (%s), a data job is expected", job.Code, job.Language)
		}
	}
	e.Saw(Job{Code: "from matplotlib import pyplot"})
	if !e.Expected() {
		t.Fatal("after code naming matplotlib, no data job is expected")
	}
	none := NewDataExpectation(nil)
	none.Saw(Job{Code: "import numpy"})
	var zero DataExpectation
	zero.Saw(Job{Code: "import numpy"})
	if none.Expected() || zero.Expected() {
		t.Fatal("a runtime without preload modules expects data jobs")
	}
}
