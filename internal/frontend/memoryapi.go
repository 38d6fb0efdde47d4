package frontend

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/state"
)

// The memory of a namespace as its owner edits it from the console: the same
// store, reserved keys, quota and compare-and-set as the sandbox's memory
// methods.

// ErrReservedKey is returned for a memory key the console may not touch.
var ErrReservedKey = errs.New(errs.Invalid, "memory keys starting with "+proxyresp.ReservedMemoryPrefix+" are reserved (saved tools, enabled catalog servers)")

// MemoryList returns namespace ns's memories whose keys start with prefix,
// without the reserved entries.
func (f *Frontend) MemoryList(ctx context.Context, ns, prefix string) ([]state.Memory, error) {
	ms, err := f.memory.MemoryList(ctx, jobs.NamespaceOf(ns), prefix)
	if err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	out := ms[:0]
	for _, m := range ms {
		if !strings.HasPrefix(m.Key, proxyresp.ReservedMemoryPrefix) {
			out = append(out, m)
		}
	}
	return out, nil
}

// MemoryGet returns namespace ns's memory key (state.ErrNotFound when there
// is none).
func (f *Frontend) MemoryGet(ctx context.Context, ns, key string) (*state.Memory, error) {
	if strings.HasPrefix(key, proxyresp.ReservedMemoryPrefix) {
		return nil, ErrReservedKey
	}
	return f.memory.MemoryGet(ctx, jobs.NamespaceOf(ns), key)
}

// MemoryPut writes namespace ns's memory key; with ifVersion, only when the
// stored version is *ifVersion (0: the key must not exist), else
// state.ErrConflict. The namespace's memory quota applies.
func (f *Frontend) MemoryPut(ctx context.Context, ns, key string, value, metadata json.RawMessage, ifVersion *uint64) (*state.Memory, error) {
	if strings.HasPrefix(key, proxyresp.ReservedMemoryPrefix) {
		return nil, ErrReservedKey
	}
	ns = jobs.NamespaceOf(ns)
	if len(value) == 0 {
		value = json.RawMessage("null")
	}
	return f.memory.MemoryPutQuota(ctx, state.Memory{Namespace: ns, Key: key, Value: value, Metadata: metadata}, ifVersion, f.policyFor(ns).MemoryBytes)
}

// MemoryDelete deletes namespace ns's memory key and reports whether it
// existed.
func (f *Frontend) MemoryDelete(ctx context.Context, ns, key string) (bool, error) {
	if strings.HasPrefix(key, proxyresp.ReservedMemoryPrefix) {
		return false, ErrReservedKey
	}
	return f.memory.MemoryDelete(ctx, jobs.NamespaceOf(ns), key)
}
