package state_test

import (
	"path/filepath"
	"testing"

	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/statetest"
)

// TestBoltConformance: the bbolt store has the behaviour of a Store.
func TestBoltConformance(t *testing.T) {
	statetest.Run(t, func(t *testing.T) state.Store {
		s, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
