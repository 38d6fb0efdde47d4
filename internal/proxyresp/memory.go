package proxyresp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/state"
)

// memoryView is a memory as sandbox code sees it.
type memoryView struct {
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	Version   uint64          `json:"version"`
}

func view(m *state.Memory) memoryView {
	return memoryView{Key: m.Key, Value: m.Value, Metadata: m.Metadata, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Version: m.Version}
}

func (r *Responder) memory(ctx context.Context, rj *runningJob, method string, params json.RawMessage) (any, error) {
	store := r.cfg.Memory
	if store == nil {
		return nil, errors.New("memory is not available on this front-end")
	}
	ns := rj.namespace()
	var p struct {
		Key       string          `json:"key"`
		Prefix    string          `json:"prefix"`
		Value     json.RawMessage `json:"value"`
		Metadata  json.RawMessage `json:"metadata"`
		IfVersion *uint64         `json:"if_version"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	if method != proxy.MethodMemoryList && p.Key == "" {
		return nil, errors.New("a memory key must be a non-empty string")
	}
	if method != proxy.MethodMemoryList && strings.HasPrefix(p.Key, ReservedMemoryPrefix) {
		return nil, fmt.Errorf("memory keys starting with %q are reserved (saved tools and enabled catalog servers live there: use save_tool, delete_saved_tool, enable_server, disable_server)", ReservedMemoryPrefix)
	}
	switch method {
	case proxy.MethodMemoryGet:
		m, err := store.MemoryGet(ctx, ns, p.Key)
		if errors.Is(err, state.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, memErr(err)
		}
		return view(m), nil
	case proxy.MethodMemoryPut:
		if len(p.Value) == 0 {
			p.Value = json.RawMessage("null")
		}
		if string(p.Metadata) == "null" {
			p.Metadata = nil
		}
		wid, _ := ctx.Value(writeIDKey{}).(string)
		m, err := store.MemoryPutQuota(ctx, state.Memory{Namespace: ns, Key: p.Key, Value: p.Value, Metadata: p.Metadata, WriteID: wid}, p.IfVersion, r.policyFor(ns).MemoryBytes)
		if errors.Is(err, state.ErrConflict) {
			return map[string]any{"conflict": true}, nil
		}
		if err != nil {
			return nil, memErr(err)
		}
		return view(m), nil
	case proxy.MethodMemoryDelete:
		ok, err := store.MemoryDelete(ctx, ns, p.Key)
		if err != nil {
			return nil, memErr(err)
		}
		return ok, nil
	default: // memory_list
		ms, err := store.MemoryList(ctx, ns, p.Prefix)
		if err != nil {
			return nil, memErr(err)
		}
		out := make([]memoryView, 0, len(ms))
		for i := range ms {
			if strings.HasPrefix(ms[i].Key, ReservedMemoryPrefix) {
				continue // saved tools and other reserved entries are not memories
			}
			out = append(out, view(&ms[i]))
		}
		return out, nil
	}
}

func memErr(err error) error { return fmt.Errorf("memory: %w", err) }

// jobResult answers job_result: the outcome of an ended job of the calling
// job's namespace.
func (r *Responder) jobResult(ctx context.Context, rj *runningJob, id string) (any, error) {
	ns := rj.namespace()
	if !jobs.ValidUserID(id) {
		return nil, fmt.Errorf("job_result: %.40q is not a job id", id)
	}
	rec, err := r.cfg.Records.Job(ctx, jobs.ScopedID(ns, id))
	if errors.Is(err, state.ErrNotFound) || (err == nil && rec.Job.Namespace != ns) {
		return nil, fmt.Errorf("job_result: no job %s in this namespace", id)
	}
	if err != nil {
		return nil, fmt.Errorf("job_result: %w", err)
	}
	if !rec.Status.Terminal() {
		return nil, fmt.Errorf("job_result: job %s has not ended (it is %s): name it in this job's after or after_any to wait for it", id, rec.Status)
	}
	return rec.View(ns).Structured(), nil
}

// FileSource reads jobs' files for a namespace; *state.Client is one.
type FileSource interface {
	File(ctx context.Context, ns, job, name string) (jobs.FileInfo, []byte, error)
}

// JobFile is the answer of job_file.
type JobFile struct {
	Name     string `json:"name"`
	Size     int64  `json:"size"`
	MimeType string `json:"mimeType"`
	Base64   string `json:"base64"`
}

// jobFile answers job_file: a file an ended job of the calling job's
// namespace wrote (another namespace's job is "no such job").
func (r *Responder) jobFile(ctx context.Context, rj *runningJob, id, name string) (any, error) {
	fs, ok := r.cfg.Records.(FileSource)
	if !ok {
		return nil, errors.New("job_file: this front-end keeps no job files")
	}
	ns := rj.namespace()
	if !jobs.ValidUserID(id) {
		return nil, fmt.Errorf("job_file: %.40q is not a job id", id)
	}
	if err := jobs.CheckFileName(name); err != nil {
		return nil, fmt.Errorf("job_file: %w", err)
	}
	info, data, err := fs.File(ctx, ns, jobs.ScopedID(ns, id), name)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("job_file: no such job or file in this namespace: job %s, file %s", id, name)
	}
	if err != nil {
		return nil, fmt.Errorf("job_file: %w", err)
	}
	return JobFile{Name: info.Name, Size: info.Size, MimeType: info.MimeType, Base64: base64.StdEncoding.EncodeToString(data)}, nil
}
