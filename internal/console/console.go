package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every console page: scripts,
// styles and connections from the front-end itself only, no inline code;
// pictures also from blob: URLs, which the console makes of job files it
// fetched with the caller's token.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Backend is what the console needs of a front-end: the job service, and
// the fleet, memory and sessions beyond it; *frontend.Frontend is one.
// Namespaces are the caller's.
type Backend interface {
	jobs.Service
	Workers(ctx context.Context) ([]jobs.WorkerStatus, error)
	// Frontends asks the fleet's front-ends for their status; Status is
	// this front-end's own.
	Frontends(ctx context.Context) ([]jobs.FrontendStatus, error)
	Status() jobs.FrontendStatus
	MemoryList(ctx context.Context, ns, prefix string) ([]state.Memory, error)
	MemoryGet(ctx context.Context, ns, key string) (*state.Memory, error)
	MemoryPut(ctx context.Context, ns, key string, value, metadata json.RawMessage, ifVersion *uint64) (*state.Memory, error)
	MemoryDelete(ctx context.Context, ns, key string) (bool, error)
	Sessions(ctx context.Context, ns string) ([]frontend.Session, error)
	EndSession(ctx context.Context, ns, name string) error
	SavedTools(ctx context.Context, ns string) ([]frontend.SavedTool, error)
	Streams(ctx context.Context) []frontend.StreamStatus
	Broker() (server, cluster string)
}

// Config configures the console's API.
type Config struct {
	Backend Backend
	// Namespace is the authenticated caller's namespace; IsAdmin says the
	// caller holds an admin token (it may name any namespace). Nil: the
	// caller httpauth put in the request's context (httpauth.Namespace,
	// httpauth.IsAdmin).
	Namespace func(ctx context.Context) string
	IsAdmin   func(ctx context.Context) bool
	// Namespaces are the namespaces an admin is offered (those of the
	// tokens file); an admin may type any other.
	Namespaces []string
	// Spans is the front-end's span recorder (nil: timelines from the
	// record alone).
	Spans *tracing.Recorder
	// History is the metric history of the charts (nil: none).
	History *History
	// FrontendID names this front-end (the fleet page marks it).
	FrontendID string
	// StaleAfter marks a worker stale when it has not answered for this long
	// (default 15 s).
	StaleAfter time.Duration
	Logger     *slog.Logger
}

// Mount adds the console's pages to extra (the front-end's unguarded
// handlers): /ui/, /ui (a redirect) and /favicon.ico (the console's icon).
func Mount(extra map[string]http.Handler) {
	ui := UI()
	extra["/ui/"] = ui
	extra["GET /ui"] = http.RedirectHandler("/ui/", http.StatusMovedPermanently)
	extra["GET /favicon.ico"] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.Clone(r.Context())
		r.URL.Path = "/ui/favicon.svg"
		ui.ServeHTTP(w, r)
	})
}

// UI returns the handler of the static pages; mount it at /ui/. The pages
// carry no data: everything comes from /api/ with the caller's token.
func UI() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := strings.TrimPrefix(r.URL.Path, "/ui/")
		if p == "" || !strings.Contains(p, ".") {
			// Every page is the one document; the script routes by the hash.
			r = r.Clone(r.Context())
			r.URL.Path = "/ui/"
		}
		files.ServeHTTP(w, r)
	})
}

// Routes serves the console's endpoints under /api/console/ and every other
// path with rest (the jobs API): the handler of /api/ behind the token guard.
func Routes(cfg Config, rest http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/api/console/", API(cfg))
	mux.Handle("/", rest)
	return mux
}

// API returns the handler of the console's endpoints; mount it at
// /api/console/ behind the token guard.
func API(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Namespace == nil {
		cfg.Namespace = httpauth.Namespace
	}
	if cfg.IsAdmin == nil {
		cfg.IsAdmin = httpauth.IsAdmin
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 15 * time.Second
	}
	a := &api{cfg: cfg, seen: map[string]workerSeen{}, seenFrontends: map[string]frontendSeen{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/console/whoami", a.whoami)
	mux.HandleFunc("GET /api/console/jobs/{id}/timeline", a.timeline)
	mux.HandleFunc("GET /api/console/fleet", a.fleet)
	mux.HandleFunc("GET /api/console/memory", a.memoryList)
	mux.HandleFunc("GET /api/console/memory/entry", a.memoryGet)
	mux.HandleFunc("PUT /api/console/memory/entry", a.memoryPut)
	mux.HandleFunc("DELETE /api/console/memory/entry", a.memoryDelete)
	mux.HandleFunc("GET /api/console/metrics", a.metrics)
	mux.HandleFunc("GET /api/console/sessions", a.sessions)
	mux.HandleFunc("POST /api/console/sessions/{name}/end", a.endSession)
	mux.HandleFunc("GET /api/console/tools", a.savedTools)
	mux.HandleFunc("/api/console/", func(w http.ResponseWriter, r *http.Request) {
		httperr.Write(w, http.StatusNotFound, "not_found", fmt.Sprintf("no console route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

type api struct {
	cfg Config

	mu            sync.Mutex // guards seen and seenFrontends
	seen          map[string]workerSeen
	seenFrontends map[string]frontendSeen
}

// Whoami is the caller as the console shows it.
type Whoami struct {
	Namespace  string   `json:"namespace"`
	Admin      bool     `json:"admin"`
	Namespaces []string `json:"namespaces,omitempty"` // offered to admins
	Frontend   string   `json:"frontend"`
}

func (a *api) whoami(w http.ResponseWriter, r *http.Request) {
	me := Whoami{Namespace: jobs.NamespaceOf(a.cfg.Namespace(r.Context())), Admin: a.cfg.IsAdmin(r.Context()), Frontend: a.cfg.FrontendID}
	if me.Admin {
		me.Namespaces = slices.Clone(a.cfg.Namespaces)
	}
	httperr.WriteJSON(w, http.StatusOK, me)
}

func (a *api) timeline(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !jobs.ValidUserID(id) {
		httperr.Write(w, http.StatusBadRequest, "bad_id", fmt.Sprintf("%.40q is not a job id", id))
		return
	}
	ns := jobs.NamespaceOf(a.cfg.Namespace(r.Context()))
	rec, err := a.cfg.Backend.Get(r.Context(), ns, id)
	if err != nil {
		writeErr(w, err, fmt.Sprintf("no job with id %q", id))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, BuildTimeline(rec, jobs.ScopedID(ns, id), a.cfg.Spans.Trace(rec.TraceID)))
}

// MaxMemoryValue bounds a memory value written from the console.
const MaxMemoryValue = 1 << 20

func (a *api) memoryList(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	if len(prefix) > state.MaxMemoryKeyBytes {
		httperr.Write(w, http.StatusBadRequest, "bad_prefix", fmt.Sprintf("prefix is over %d bytes", state.MaxMemoryKeyBytes))
		return
	}
	ms, err := a.cfg.Backend.MemoryList(r.Context(), a.cfg.Namespace(r.Context()), prefix)
	if err != nil {
		writeErr(w, err, "")
		return
	}
	if ms == nil {
		ms = []state.Memory{}
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"memories": ms})
}

func memoryKey(w http.ResponseWriter, key string) bool {
	if key == "" || len(key) > state.MaxMemoryKeyBytes {
		httperr.Write(w, http.StatusBadRequest, "bad_key", fmt.Sprintf("a memory key is 1-%d bytes", state.MaxMemoryKeyBytes))
		return false
	}
	return true
}

func (a *api) memoryGet(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if !memoryKey(w, key) {
		return
	}
	m, err := a.cfg.Backend.MemoryGet(r.Context(), a.cfg.Namespace(r.Context()), key)
	if err != nil {
		writeErr(w, err, fmt.Sprintf("no memory %.60q", key))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, m)
}

// PutRequest is the body of PUT /api/console/memory/entry.
type PutRequest struct {
	Key      string          `json:"key"`
	Value    json.RawMessage `json:"value"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// IfVersion: write only over this version (0: only a new key), as the
	// sandbox's compare-and-set; absent: unconditionally.
	IfVersion *uint64 `json:"if_version,omitempty"`
}

func (a *api) memoryPut(w http.ResponseWriter, r *http.Request) {
	var req PutRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 2*MaxMemoryValue))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httperr.Write(w, http.StatusBadRequest, "bad_json", `the body must be {"key": ..., "value": <JSON>, "if_version": n}: `+err.Error())
		return
	}
	if !memoryKey(w, req.Key) {
		return
	}
	if len(req.Value) > MaxMemoryValue || len(req.Metadata) > MaxMemoryValue {
		httperr.Write(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("a value from the console is at most %d bytes", MaxMemoryValue))
		return
	}
	m, err := a.cfg.Backend.MemoryPut(r.Context(), a.cfg.Namespace(r.Context()), req.Key, req.Value, req.Metadata, req.IfVersion)
	if errors.Is(err, state.ErrConflict) {
		cur, _ := a.cfg.Backend.MemoryGet(r.Context(), a.cfg.Namespace(r.Context()), req.Key) // nil when deleted meanwhile: the answer says so
		httperr.WriteJSON(w, http.StatusConflict, map[string]any{"error": httperr.Body{Code: "conflict", Message: "the key changed since you read it: reload it and edit again"}, "current": cur})
		return
	}
	if err != nil {
		writeErr(w, err, "")
		return
	}
	httperr.WriteJSON(w, http.StatusOK, m)
}

func (a *api) memoryDelete(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if !memoryKey(w, key) {
		return
	}
	ok, err := a.cfg.Backend.MemoryDelete(r.Context(), a.cfg.Namespace(r.Context()), key)
	if err != nil {
		writeErr(w, err, "")
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]bool{"deleted": ok})
}

func (a *api) sessions(w http.ResponseWriter, r *http.Request) {
	ss, err := a.cfg.Backend.Sessions(r.Context(), a.cfg.Namespace(r.Context()))
	if err != nil {
		writeErr(w, err, "")
		return
	}
	if ss == nil {
		ss = []frontend.Session{}
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"sessions": ss})
}

func (a *api) endSession(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !jobs.ValidUserID(name) {
		httperr.Write(w, http.StatusBadRequest, "bad_session", fmt.Sprintf("%.40q is not a session name", name))
		return
	}
	if err := a.cfg.Backend.EndSession(r.Context(), a.cfg.Namespace(r.Context()), name); err != nil {
		writeErr(w, err, fmt.Sprintf("no live session %q", name))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]bool{"ended": true})
}

func (a *api) savedTools(w http.ResponseWriter, r *http.Request) {
	ts, err := a.cfg.Backend.SavedTools(r.Context(), a.cfg.Namespace(r.Context()))
	if err != nil {
		writeErr(w, err, "")
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"tools": ts})
}

func (a *api) metrics(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.History == nil {
		httperr.WriteJSON(w, http.StatusOK, Series{})
		return
	}
	httperr.WriteJSON(w, http.StatusOK, a.cfg.History.Series())
}

// writeErr answers err as httperr classifies it; notFound replaces a
// not-found message.
func writeErr(w http.ResponseWriter, err error, notFound string) {
	status, code, msg := httperr.Classify(err)
	if status == http.StatusNotFound && notFound != "" {
		msg = notFound
	}
	httperr.Write(w, status, code, msg)
}
