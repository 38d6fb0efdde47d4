package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/state"
)

// Saved tools: functions a namespace's code saved with save_tool, defined in
// the namespace's later Python jobs. They live in the namespace's memory, in
// one entry under a reserved key that the memory methods refuse and that
// memory listings leave out, so the only way to change them is through these
// checks. One entry keeps the count cap exact (every change is a
// compare-and-set of the whole set) and loading them one state read.
const (
	// ReservedMemoryPrefix starts the memory keys sandbox code may not read
	// or write with the memory methods.
	ReservedMemoryPrefix = "__mcpexec"
	// SavedToolsKey is the memory key of a namespace's saved tools.
	SavedToolsKey = ReservedMemoryPrefix + "_saved_tools__"
	// MaxSavedToolSource bounds one saved tool's source, in bytes.
	MaxSavedToolSource = 64 << 10
	// MaxSavedTools bounds the saved tools of a namespace.
	MaxSavedTools = 100
	// MaxSavedToolsBytes bounds the sources of a namespace's saved tools
	// together, so that all of them load in one proxy answer.
	MaxSavedToolsBytes = 512 << 10
	// MaxSavedToolName bounds a saved tool's name, in bytes.
	MaxSavedToolName = 64
)

// savedTool is one saved tool as stored and as saved_tool_list answers it.
type savedTool struct {
	Name    string    `json:"name"`
	Source  string    `json:"source"`
	SavedAt time.Time `json:"saved_at"`
}

type savedToolSet struct {
	Tools map[string]savedTool `json:"tools"`
}

// pythonKeywords are Python 3's hard keywords: not names a function can have.
var pythonKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true, "global": true, "if": true,
	"import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}

// CheckSavedToolName reports why name cannot name a saved tool: it must be an
// ASCII Python identifier of at most MaxSavedToolName bytes, not a keyword.
func CheckSavedToolName(name string) error {
	ok := name != "" && len(name) <= MaxSavedToolName && !pythonKeywords[name]
	for i, c := range name {
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("saved tool name %.80q is not a Python identifier (ASCII letters, digits and _, not a keyword, at most %d bytes)", name, MaxSavedToolName)
	}
	return nil
}

// CheckSavedToolSource reports why source cannot be saved.
func CheckSavedToolSource(source string) error {
	if strings.TrimSpace(source) == "" {
		return errors.New("a saved tool's source is empty")
	}
	if len(source) > MaxSavedToolSource {
		return fmt.Errorf("a saved tool's source is %d bytes, over the %d-byte limit", len(source), MaxSavedToolSource)
	}
	return nil
}

func (h *proxyHandler) savedTools(ctx context.Context, rj *runningJob, method string, params json.RawMessage) (any, error) {
	store := h.f.memory
	if store == nil {
		return nil, errors.New("saved tools are not available on this front-end (it has no memory store)")
	}
	var p struct {
		Name   string `json:"name"`
		Source string `json:"source"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	ns := rj.namespace()
	if method == proxy.MethodSavedToolList {
		set, _, err := loadSavedTools(ctx, store, ns)
		if err != nil {
			return nil, err
		}
		return set.sorted(), nil
	}
	if err := CheckSavedToolName(p.Name); err != nil {
		return nil, err
	}
	if method == proxy.MethodSavedToolPut {
		if err := CheckSavedToolSource(p.Source); err != nil {
			return nil, err
		}
	}
	wid, _ := ctx.Value(writeIDKey{}).(string)
	// Read, change, compare-and-set; another job of the namespace may change
	// the set meanwhile.
	for range 20 {
		set, version, err := loadSavedTools(ctx, store, ns)
		if err != nil {
			return nil, err
		}
		var answer any
		if method == proxy.MethodSavedToolDelete {
			if _, ok := set.Tools[p.Name]; !ok {
				return false, nil
			}
			delete(set.Tools, p.Name)
			answer = true
		} else {
			_, replaces := set.Tools[p.Name]
			if !replaces && len(set.Tools) >= MaxSavedTools {
				return nil, fmt.Errorf("namespace %q already has %d saved tools, the most it may keep: delete_saved_tool(name) one first", ns, len(set.Tools))
			}
			t := savedTool{Name: p.Name, Source: p.Source, SavedAt: time.Now().UTC()}
			set.Tools[p.Name] = t
			if total := set.bytes(); total > MaxSavedToolsBytes {
				return nil, fmt.Errorf("saved tools of namespace %q would total %d bytes of source, over the %d-byte limit: delete_saved_tool(name) some first", ns, total, MaxSavedToolsBytes)
			}
			answer = map[string]any{"name": t.Name, "bytes": len(t.Source), "saved_at": t.SavedAt, "replaced": replaces, "count": len(set.Tools)}
		}
		if method == proxy.MethodSavedToolDelete && len(set.Tools) == 0 {
			if _, err := store.MemoryDelete(ctx, ns, SavedToolsKey); err != nil {
				return nil, memErr(err)
			}
			return answer, nil
		}
		value, err := json.Marshal(set)
		if err != nil {
			return nil, err
		}
		_, err = store.MemoryPutQuota(ctx, state.Memory{Namespace: ns, Key: SavedToolsKey, Value: value, WriteID: wid}, &version, h.f.policyFor(ns).MemoryBytes)
		if errors.Is(err, state.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, memErr(err)
		}
		return answer, nil
	}
	return nil, errors.New("saved tools kept changing under concurrent changes: try again")
}

// loadSavedTools reads ns's saved tools and the version of their entry (0 when
// there is none).
func loadSavedTools(ctx context.Context, store MemoryStore, ns string) (savedToolSet, uint64, error) {
	set := savedToolSet{Tools: map[string]savedTool{}}
	m, err := store.MemoryGet(ctx, ns, SavedToolsKey)
	if errors.Is(err, state.ErrNotFound) {
		return set, 0, nil
	}
	if err != nil {
		return set, 0, memErr(err)
	}
	if err := json.Unmarshal(m.Value, &set); err != nil {
		return set, 0, fmt.Errorf("saved tools: stored entry is damaged: %w", err)
	}
	if set.Tools == nil {
		set.Tools = map[string]savedTool{}
	}
	return set, m.Version, nil
}

func (s savedToolSet) sorted() []savedTool {
	out := make([]savedTool, 0, len(s.Tools))
	for _, t := range s.Tools {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s savedToolSet) bytes() int {
	n := 0
	for _, t := range s.Tools {
		n += len(t.Source)
	}
	return n
}
