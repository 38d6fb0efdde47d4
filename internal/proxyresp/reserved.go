package proxyresp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mcpexec/mcpexec/internal/state"
)

// Reserved memory entries: documents of a namespace that only the front-end
// changes (its saved tools, its enabled catalog servers). They live in the
// namespace's memory, so they are replicated, persisted and counted against
// its quota like any memory, under keys starting with ReservedMemoryPrefix,
// which the memory methods refuse and memory listings leave out. Each is one
// entry, so a cap on what it holds is exact: every change is a
// compare-and-set of the whole document.

// reservedChange says what updateReserved does with a changed document.
type reservedChange int

const (
	reservedKeep   reservedChange = iota // write nothing
	reservedStore                        // store the document
	reservedRemove                       // delete the entry
)

// maxReservedAttempts bounds updateReserved's compare-and-set attempts.
const maxReservedAttempts = 20

// loadReserved reads ns's reserved entry key into v (left as it is when there
// is none) and returns the entry's version (0: none). what names the document
// in errors.
func loadReserved(ctx context.Context, store MemoryStore, ns, key, what string, v any) (uint64, error) {
	m, err := store.MemoryGet(ctx, ns, key)
	if errors.Is(err, state.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, memErr(err)
	}
	if err := json.Unmarshal(m.Value, v); err != nil {
		return 0, fmt.Errorf("%s: the stored entry is damaged: %w", what, err)
	}
	return m.Version, nil
}

// updateReserved changes ns's reserved entry key: it reads the document into
// a fresh value, lets change alter it, and compare-and-sets the result, again
// when another writer came between. The answer is change's. wid is the write
// id of a proxy call ("" for none), so a retried call writes once; quota is
// the namespace's memory cap.
func updateReserved[T any](ctx context.Context, store MemoryStore, ns, key, what, wid string, quota int64,
	fresh func() *T, change func(doc *T) (any, reservedChange, error)) (any, error) {
	for range maxReservedAttempts {
		doc := fresh()
		version, err := loadReserved(ctx, store, ns, key, what, doc)
		if err != nil {
			return nil, err
		}
		answer, act, err := change(doc)
		if err != nil {
			return nil, err
		}
		switch act {
		case reservedKeep:
			return answer, nil
		case reservedRemove:
			if _, err := store.MemoryDelete(ctx, ns, key); err != nil {
				return nil, memErr(err)
			}
			return answer, nil
		}
		value, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		_, err = store.MemoryPutQuota(ctx, state.Memory{Namespace: ns, Key: key, Value: value, WriteID: wid}, &version, quota)
		if errors.Is(err, state.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, memErr(err)
		}
		return answer, nil
	}
	return nil, fmt.Errorf("%s kept changing under concurrent changes: try again", what)
}
