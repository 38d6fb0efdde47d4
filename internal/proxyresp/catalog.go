package proxyresp

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/tooldocs"
)

// Catalog servers are the operator's known-but-not-enabled MCP servers
// (--catalog). A namespace's code finds them (find_servers), enables one for
// the namespace (enable_server) and disables it again (disable_server). The
// namespace's enabled set is a reserved memory entry (reserved.go): it
// survives front-end restarts and every front-end reads the same one. A
// catalog server answers a namespace's calls exactly while the namespace has
// it enabled, checked at each call, so disabling it revokes it at once.
const (
	// EnabledServersKey is the memory key of a namespace's enabled catalog
	// servers.
	EnabledServersKey = ReservedMemoryPrefix + "_enabled_servers__"
	// MaxEnabledServers bounds the catalog servers one namespace enables.
	MaxEnabledServers = 64
	// MaxCatalogQuery bounds find_servers' query, in bytes.
	MaxCatalogQuery = 1024
	// DefaultFindLimit and MaxFindLimit bound find_servers' answer.
	DefaultFindLimit = 5
	MaxFindLimit     = 100
)

type enabledSet struct {
	Servers map[string]enabledServer `json:"servers"`
}

type enabledServer struct {
	EnabledAt time.Time `json:"enabled_at"`
}

func newEnabledSet() *enabledSet { return &enabledSet{Servers: map[string]enabledServer{}} }

// catalog returns the catalog servers namespace ns may enable (its policy
// applied), in catalog order.
func (r *Responder) catalog(ns string) []discovery.Server {
	if r.cfg.Tools == nil {
		return nil
	}
	p := r.policyFor(ns)
	var out []discovery.Server
	for _, s := range r.cfg.Tools.Servers() {
		if s.Catalog && p.allowsServer(s.Name) {
			out = append(out, s)
		}
	}
	return out
}

// catalogServer returns the definition of name when it is a catalog server.
func (r *Responder) catalogServer(name string) (discovery.Server, bool) {
	if r.cfg.Tools == nil {
		return discovery.Server{}, false
	}
	for _, s := range r.cfg.Tools.Servers() {
		if s.Name == name {
			return s, s.Catalog
		}
	}
	return discovery.Server{}, false
}

func (r *Responder) enabledSet(ctx context.Context, ns string) (*enabledSet, error) {
	if r.cfg.Memory == nil {
		return nil, errCatalogNoMemory
	}
	set := newEnabledSet()
	if _, err := loadReserved(ctx, r.cfg.Memory, ns, EnabledServersKey, "enabled servers", set); err != nil {
		return nil, err
	}
	if set.Servers == nil {
		set.Servers = map[string]enabledServer{}
	}
	return set, nil
}

var errCatalogNoMemory = fmt.Errorf("the server catalog is not available on this front-end (it has no memory store)")

// EnabledServers returns the catalog servers namespace ns has enabled and
// may use now, sorted.
func (r *Responder) EnabledServers(ctx context.Context, ns string) ([]string, error) {
	cat := r.catalog(ns)
	if len(cat) == 0 {
		return nil, nil
	}
	set, err := r.enabledSet(ctx, ns)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range cat {
		if _, ok := set.Servers[s.Name]; ok {
			out = append(out, s.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// catalogEnabled reports whether namespace ns has catalog server name
// enabled now.
func (r *Responder) catalogEnabled(ctx context.Context, ns, name string) (bool, error) {
	set, err := r.enabledSet(ctx, ns)
	if err != nil {
		return false, err
	}
	_, ok := set.Servers[name]
	return ok, nil
}

func entryOf(s discovery.Server, enabled bool) discovery.CatalogEntry {
	transport := s.Type
	if transport == "" {
		transport = "stdio"
		if s.Remote() {
			transport = "http"
		}
	}
	return discovery.CatalogEntry{Name: s.Name, Alias: tooldocs.Identifier(s.Name), Description: s.Description, Transport: transport, Enabled: enabled}
}

// FindServers ranks the catalog servers namespace ns may enable against
// query (BM25 over their names and descriptions, as search_tool_docs ranks
// tools), best first, at most limit (DefaultFindLimit when 0). An empty query
// lists them all by name, up to MaxFindLimit.
func (r *Responder) FindServers(ctx context.Context, ns, query string, limit int) ([]discovery.CatalogEntry, error) {
	if len(query) > MaxCatalogQuery {
		return nil, fmt.Errorf("the query is %d bytes, over the %d-byte limit: describe what you need in a few words", len(query), MaxCatalogQuery)
	}
	switch {
	case limit < 0:
		return nil, fmt.Errorf("limit %d is negative: ask for 1 to %d servers", limit, MaxFindLimit)
	case limit == 0:
		limit = DefaultFindLimit
	case limit > MaxFindLimit:
		limit = MaxFindLimit
	}
	cat := r.catalog(ns)
	if len(cat) == 0 {
		return []discovery.CatalogEntry{}, nil
	}
	set, err := r.enabledSet(ctx, ns)
	if err != nil {
		return nil, err
	}
	byName := map[string]discovery.Server{}
	out := []discovery.CatalogEntry{}
	if strings.TrimSpace(query) == "" {
		sort.Slice(cat, func(i, j int) bool { return cat[i].Name < cat[j].Name })
		for _, s := range cat[:min(len(cat), MaxFindLimit)] {
			_, on := set.Servers[s.Name]
			out = append(out, entryOf(s, on))
		}
		return out, nil
	}
	docs := make([]tooldocs.Tool, 0, len(cat))
	for _, s := range cat {
		byName[s.Name] = s
		docs = append(docs, tooldocs.Tool{Name: s.Name, Description: s.Description})
	}
	for _, hit := range tooldocs.NewIndex(docs).Search(query, limit) {
		_, on := set.Servers[hit.Tool.Name]
		e := entryOf(byName[hit.Tool.Name], on)
		e.Score = hit.Score
		out = append(out, e)
	}
	return out, nil
}

// EnableServer enables catalog server name for namespace ns.
func (r *Responder) EnableServer(ctx context.Context, ns, name string) (discovery.CatalogEntry, error) {
	return r.enableServer(ctx, ns, name, "")
}

// DisableServer disables catalog server name for namespace ns; it reports
// whether it was enabled.
func (r *Responder) DisableServer(ctx context.Context, ns, name string) (bool, error) {
	return r.disableServer(ctx, ns, name, "")
}

// enableServer is EnableServer; wid is the write id of the proxy call asking
// ("" for none), so that a retried call writes once.
func (r *Responder) enableServer(ctx context.Context, ns, name, wid string) (discovery.CatalogEntry, error) {
	s, err := r.checkCatalogName(ns, name)
	if err != nil {
		return discovery.CatalogEntry{}, err
	}
	if r.cfg.Memory == nil {
		return discovery.CatalogEntry{}, errCatalogNoMemory
	}
	already := false
	_, err = updateReserved(ctx, r.cfg.Memory, ns, EnabledServersKey, "enabled servers", wid, r.policyFor(ns).MemoryBytes, newEnabledSet,
		func(set *enabledSet) (any, reservedChange, error) {
			if set.Servers == nil {
				set.Servers = map[string]enabledServer{}
			}
			if _, ok := set.Servers[name]; ok {
				already = true
				return nil, reservedKeep, nil
			}
			if len(set.Servers) >= MaxEnabledServers {
				return nil, 0, fmt.Errorf("namespace %q has %d catalog servers enabled, the most it may: disable_server(name) one first", ns, len(set.Servers))
			}
			set.Servers[name] = enabledServer{EnabledAt: time.Now().UTC()}
			return nil, reservedStore, nil
		})
	if err != nil {
		return discovery.CatalogEntry{}, err
	}
	if !already {
		r.log.Info("catalog server enabled", "namespace", ns, "server", name)
		r.catalogChanged(ns)
	}
	e := entryOf(s, true)
	e.AlreadyEnabled = already
	return e, nil
}

func (r *Responder) disableServer(ctx context.Context, ns, name, wid string) (bool, error) {
	if !discovery.NamePattern.MatchString(name) {
		return false, fmt.Errorf("%.80q is not a server name", name)
	}
	if r.cfg.Memory == nil {
		return false, errCatalogNoMemory
	}
	res, err := updateReserved(ctx, r.cfg.Memory, ns, EnabledServersKey, "enabled servers", wid, r.policyFor(ns).MemoryBytes, newEnabledSet,
		func(set *enabledSet) (any, reservedChange, error) {
			if _, ok := set.Servers[name]; !ok {
				return false, reservedKeep, nil
			}
			delete(set.Servers, name)
			if len(set.Servers) == 0 {
				return true, reservedRemove, nil
			}
			return true, reservedStore, nil
		})
	if err != nil {
		return false, err
	}
	was, _ := res.(bool) // the change answers a bool
	if was {
		r.log.Info("catalog server disabled", "namespace", ns, "server", name)
		r.catalogChanged(ns)
	}
	return was, nil
}

// checkCatalogName says why namespace ns may not enable name, or returns
// its definition.
func (r *Responder) checkCatalogName(ns, name string) (discovery.Server, error) {
	if !discovery.NamePattern.MatchString(name) {
		return discovery.Server{}, fmt.Errorf("%.80q is not a server name: find_servers(query) lists the servers you may enable", name)
	}
	s, isCatalog := r.catalogServer(name)
	switch {
	case s.Name != "" && !isCatalog:
		return s, fmt.Errorf("%q is configured on this front-end, not a catalog server: it needs no enabling; pass it in run_python's servers", name)
	case !isCatalog:
		return s, fmt.Errorf("no catalog server is named %q: find_servers(query) lists the servers you may enable", name)
	case !r.policyFor(ns).allowsServer(name):
		return s, fmt.Errorf("server %q is not allowed for namespace %q", name, ns)
	}
	return s, nil
}

// catalogChanged tells Config.OnCatalogChange that ns's servers changed.
func (r *Responder) catalogChanged(ns string) {
	if r.cfg.OnCatalogChange != nil {
		r.cfg.OnCatalogChange(ns)
	}
}

// catalogCall answers the catalog proxy methods of a running job.
func (r *Responder) catalogCall(ctx context.Context, rj *runningJob, method string, p catalogParams) (any, error) {
	wid, _ := ctx.Value(writeIDKey{}).(string)
	ns := rj.namespace()
	switch method {
	case proxy.MethodCatalogFind:
		return r.FindServers(ctx, ns, p.Query, p.Limit)
	case proxy.MethodCatalogEnable:
		return r.enableServer(ctx, ns, p.Name, wid)
	default:
		was, err := r.disableServer(ctx, ns, p.Name, wid)
		if err != nil {
			return nil, err
		}
		return map[string]any{"name": p.Name, "disabled": was}, nil
	}
}

type catalogParams struct {
	Query string `json:"query"`
	Limit int    `json:"limit"`
	Name  string `json:"name"`
}
