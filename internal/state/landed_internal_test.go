package state

import (
	"errors"
	"testing"
)

// TestLandedCannotTellIsNotAConflict: a retried compare-and-set put that
// JetStream refused (its id forgotten, the key moved on) is a conflict only
// when the replica, caught up, does not remember the write. When it cannot
// catch up, the answer is ErrUnavailable (retry with the same id), never a
// conflict, which makes update_memory apply its change again.
func TestLandedCannotTellIsNotAConflict(t *testing.T) {
	away := errors.New("no memory stream leader")
	looked := false
	lookup := func(id string) (uint64, bool, error) {
		looked = true
		if id == "w-landed" {
			return 7, true, nil
		}
		return 0, false, nil
	}
	for _, c := range []struct {
		name    string
		catchUp error
		id      string
		seq     uint64
		ok      bool
		unavail bool
	}{
		{"caught up, the write landed", nil, "w-landed", 7, true, false},
		{"caught up, never landed: a conflict", nil, "w-other", 0, false, false},
		{"cannot catch up: cannot tell", away, "w-landed", 0, false, true},
	} {
		looked = false
		seq, ok, err := landed(func() error { return c.catchUp }, lookup, c.id)
		if seq != c.seq || ok != c.ok || errors.Is(err, ErrUnavailable) != c.unavail || (err != nil) != c.unavail {
			t.Errorf("%s: %d %v %v", c.name, seq, ok, err)
		}
		if c.unavail && (looked || !errors.Is(err, away)) {
			t.Errorf("%s: looked up %v, error %v (want the catch-up's cause, no lookup)", c.name, looked, err)
		}
	}
}
