package proxyresp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
)

// Saved tools: functions a namespace's code saved with save_tool, defined in
// the namespace's later Python jobs. They live in one reserved memory entry
// of the namespace (reserved.go), so the only way to change them is through
// these checks, the count cap is exact and loading them is one state read.
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

func (r *Responder) savedTools(ctx context.Context, rj *runningJob, method string, params json.RawMessage) (any, error) {
	store := r.cfg.Memory
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
		set, err := loadSavedTools(ctx, store, ns)
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
	return updateReserved(ctx, store, ns, SavedToolsKey, "saved tools", wid, r.policyFor(ns).MemoryBytes, newSavedToolSet,
		func(set *savedToolSet) (any, reservedChange, error) {
			if method == proxy.MethodSavedToolDelete {
				if _, ok := set.Tools[p.Name]; !ok {
					return false, reservedKeep, nil
				}
				delete(set.Tools, p.Name)
				if len(set.Tools) == 0 {
					return true, reservedRemove, nil
				}
				return true, reservedStore, nil
			}
			_, replaces := set.Tools[p.Name]
			if !replaces && len(set.Tools) >= MaxSavedTools {
				return nil, 0, fmt.Errorf("namespace %q already has %d saved tools, the most it may keep: delete_saved_tool(name) one first", ns, len(set.Tools))
			}
			t := savedTool{Name: p.Name, Source: p.Source, SavedAt: time.Now().UTC()}
			set.Tools[p.Name] = t
			if total := set.bytes(); total > MaxSavedToolsBytes {
				return nil, 0, fmt.Errorf("saved tools of namespace %q would total %d bytes of source, over the %d-byte limit: delete_saved_tool(name) some first", ns, total, MaxSavedToolsBytes)
			}
			return map[string]any{"name": t.Name, "bytes": len(t.Source), "saved_at": t.SavedAt, "replaced": replaces, "count": len(set.Tools)}, reservedStore, nil
		})
}

func newSavedToolSet() *savedToolSet { return &savedToolSet{Tools: map[string]savedTool{}} }

// loadSavedTools reads ns's saved tools.
func loadSavedTools(ctx context.Context, store MemoryStore, ns string) (*savedToolSet, error) {
	set := newSavedToolSet()
	if _, err := loadReserved(ctx, store, ns, SavedToolsKey, "saved tools", set); err != nil {
		return nil, err
	}
	if set.Tools == nil {
		set.Tools = map[string]savedTool{}
	}
	return set, nil
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

// SavedTool is a saved tool as the console lists it.
type SavedTool struct {
	Name    string    `json:"name"`
	Source  string    `json:"source"`
	SavedAt time.Time `json:"saved_at"`
}

// SavedTools returns namespace ns's saved tools (save_tool), by name.
func (r *Responder) SavedTools(ctx context.Context, ns string) ([]SavedTool, error) {
	if r.cfg.Memory == nil {
		return nil, errors.New("saved tools are not available on this front-end (it has no memory store)")
	}
	set, err := loadSavedTools(ctx, r.cfg.Memory, jobs.NamespaceOf(ns))
	if err != nil {
		return nil, err
	}
	out := []SavedTool{}
	for _, t := range set.sorted() {
		out = append(out, SavedTool(t))
	}
	return out, nil
}
