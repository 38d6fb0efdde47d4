// Package mcpclients keeps MCP client sessions to the servers a front-end proxies:
// started lazily on first use, kept warm, closed after an idle timeout, restarted
// with backoff after a crash, with each server's tool list cached and refreshed on
// notifications/tools/list_changed.
package mcpclients

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/periodic"
)

// Config tunes a Pool.
type Config struct {
	IdleTimeout  time.Duration // close a session unused this long (default 5m)
	StartTimeout time.Duration // start + initialize bound (default 30s)
	MinBackoff   time.Duration // first restart delay after a crash (default 250ms)
	MaxBackoff   time.Duration // longest restart delay (default 30s)
	Policy       discovery.Policy
	Logger       *slog.Logger // child stderr lines are logged here at info level
	// OnStartFailure, when set, hears of each server that failed to start
	// (an agent's client shows it: the front-end sends it as an MCP log
	// message).
	OnStartFailure func(server string, err error)
	ClientName     string
	Version        string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{IdleTimeout: 5 * time.Minute, StartTimeout: 30 * time.Second,
		MinBackoff: 250 * time.Millisecond, MaxBackoff: 30 * time.Second,
		ClientName: "mcpexec", Version: "0.1.0"}
}

// ErrUnknownServer is returned for a name the pool does not hold.
var ErrUnknownServer = errors.New("unknown MCP server")

// ErrDenied is returned for a server the policy denies.
var ErrDenied = errors.New("MCP server denied by policy")

// ToolError is a tool's own failure (a result with isError): its text is the
// server's message.
type ToolError struct {
	Server, Tool, Message string
}

func (e *ToolError) Error() string { return e.Message }

// Pool holds one session slot per server.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.RWMutex // guards order and servers (Update changes them)
	order   []string
	servers map[string]*slot

	ctx    context.Context    // set by New, before any goroutine starts
	cancel context.CancelFunc // ends ctx, in Close
	wg     sync.WaitGroup
}

// New returns a pool of servers (already discovered and filtered). Start begins
// the idle janitor; sessions start on first use.
func New(servers []discovery.Server, cfg Config) *Pool {
	d := DefaultConfig()
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = d.IdleTimeout
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = d.StartTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = d.MinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = d.MaxBackoff
	}
	if cfg.ClientName == "" {
		cfg.ClientName, cfg.Version = d.ClientName, d.Version
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, servers: map[string]*slot{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, s := range servers {
		if _, dup := p.servers[s.Name]; dup {
			continue
		}
		p.order = append(p.order, s.Name)
		p.servers[s.Name] = &slot{def: s, pool: p}
	}
	return p
}

// Start runs the idle janitor until Stop.
func (p *Pool) Start(context.Context) error {
	interval := min(p.cfg.IdleTimeout/4, 30*time.Second)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		periodic.Run(p.ctx, max(interval, 10*time.Millisecond), func() {
			for _, sl := range p.slots() {
				sl.closeIfIdle(p.cfg.IdleTimeout)
			}
		})
	}()
	return nil
}

// Stop closes every session and ends the janitor. It is idempotent and safe
// before Start.
func (p *Pool) Stop() {
	p.cancel()
	p.wg.Wait()
	for _, sl := range p.slots() {
		sl.close("pool stopped")
	}
}

// slots returns the slots in discovery order.
func (p *Pool) slots() []*slot {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]*slot, 0, len(p.order))
	for _, n := range p.order {
		out = append(out, p.servers[n])
	}
	return out
}

// Servers returns the definitions the policy allows, in discovery order.
func (p *Pool) Servers() []discovery.Server {
	var out []discovery.Server
	for _, sl := range p.slots() {
		if p.cfg.Policy.Allowed(sl.def.Name) {
			out = append(out, sl.def)
		}
	}
	return out
}

// Names returns the allowed server names, sorted, but for catalog servers
// (those only a namespace that enabled them uses).
func (p *Pool) Names() []string {
	var out []string
	for _, s := range p.Servers() {
		if !s.Catalog {
			out = append(out, s.Name)
		}
	}
	sort.Strings(out)
	return out
}

func (p *Pool) slot(name string) (*slot, error) {
	p.mu.RLock()
	s, ok := p.servers[name]
	p.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q: known servers are %s", ErrUnknownServer, name, strings.Join(p.Names(), ", "))
	}
	if !p.cfg.Policy.Allowed(name) {
		return nil, fmt.Errorf("%w: %q may not be used on this front-end", ErrDenied, name)
	}
	return s, nil
}

// Tools returns server's tools, from the cache when it is fresh.
func (p *Pool) Tools(ctx context.Context, server string) ([]mcp.Tool, error) {
	s, err := p.slot(server)
	if err != nil {
		return nil, err
	}
	return s.tools(ctx)
}

// CallTool calls tool on server. A result with isError comes back as a
// *ToolError carrying the server's message.
func (p *Pool) CallTool(ctx context.Context, server, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	s, err := p.slot(server)
	if err != nil {
		return nil, err
	}
	return s.call(ctx, tool, args)
}

// Running reports whether server has a live session (for tests and metrics).
func (p *Pool) Running(server string) bool {
	p.mu.RLock()
	s, ok := p.servers[server]
	p.mu.RUnlock()
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess != nil
}

// resultText joins a result's text contents.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	if len(parts) == 0 {
		return "the tool reported an error without a message"
	}
	return strings.Join(parts, "\n")
}
