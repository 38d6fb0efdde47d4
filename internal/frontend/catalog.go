package frontend

import (
	"context"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
)

// The server catalog and saved tools live in the proxy responder (package
// proxyresp), which sandbox code reaches; the front-end's callers reach them
// here.

// SavedTool is a saved tool as the console lists it.
type SavedTool = proxyresp.SavedTool

// SavedTools returns namespace ns's saved tools (save_tool), by name.
func (f *Frontend) SavedTools(ctx context.Context, ns string) ([]SavedTool, error) {
	return f.resp.SavedTools(ctx, ns)
}

// EnabledServers returns the catalog servers namespace ns has enabled and
// may use now, sorted.
func (f *Frontend) EnabledServers(ctx context.Context, ns string) ([]string, error) {
	return f.resp.EnabledServers(ctx, ns)
}

// FindServers ranks the catalog servers namespace ns may enable against
// query (proxyresp.Responder.FindServers).
func (f *Frontend) FindServers(ctx context.Context, ns, query string, limit int) ([]discovery.CatalogEntry, error) {
	return f.resp.FindServers(ctx, ns, query, limit)
}

// EnableServer enables catalog server name for namespace ns.
func (f *Frontend) EnableServer(ctx context.Context, ns, name string) (discovery.CatalogEntry, error) {
	return f.resp.EnableServer(ctx, ns, name)
}

// DisableServer disables catalog server name for namespace ns; it reports
// whether it was enabled.
func (f *Frontend) DisableServer(ctx context.Context, ns, name string) (bool, error) {
	return f.resp.DisableServer(ctx, ns, name)
}
