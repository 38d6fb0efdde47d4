package mcpclients

// A slot is one proxied server's sessions: started on demand, restarted
// with backoff when they crash, closed when idle.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/discovery"
)

// slot is one server's session, started on demand.
type slot struct {
	def  discovery.Server
	pool *Pool

	mu        sync.Mutex // guards every field below
	sess      *session   // nil when not running
	starting  chan struct{}
	startErr  error
	failures  int       // crashes since the last successful call
	notBefore time.Time // restart not before (backoff)
	toolCache []mcp.Tool
	toolGen   uint64 // bumped by tools/list_changed
	gone      bool   // removed from the pool: starts nothing more
}

type session struct {
	c        *client.Client
	cmd      *exec.Cmd // nil for remote servers
	stderr   *tailWriter
	inflight int
	lastUsed time.Time
}

// acquire returns a running session, starting one when needed; release must be
// called when done with it.
func (s *slot) acquire(ctx context.Context) (*session, error) {
	for {
		s.mu.Lock()
		if s.gone {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w %q: its definition was removed or changed in the config", ErrUnknownServer, s.def.Name)
		}
		if s.sess != nil && s.sess.cmd != nil && !processAlive(s.sess.cmd) {
			s.crashedLocked(s.sess, "exited while idle")
		}
		if s.sess != nil {
			sess := s.sess
			sess.inflight++
			sess.lastUsed = time.Now()
			s.mu.Unlock()
			return sess, nil
		}
		if s.starting != nil {
			ch := s.starting
			s.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, fmt.Errorf("wait for MCP server %q to start: %w", s.def.Name, ctx.Err())
			}
			s.mu.Lock()
			err := s.startErr
			s.mu.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		}
		wait := time.Until(s.notBefore)
		ch := make(chan struct{})
		s.starting, s.startErr = ch, nil
		s.mu.Unlock()

		var sess *session
		var err error
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				err = fmt.Errorf("MCP server %q crashed and restarts in %s: %w", s.def.Name, wait.Round(time.Millisecond), ctx.Err())
			}
		}
		if err == nil {
			sess, err = s.start()
		}
		s.mu.Lock()
		s.starting = nil
		var stale *session // retired while it started
		if err == nil && s.gone {
			stale, sess = sess, nil
			err = fmt.Errorf("%w %q: its definition was removed or changed in the config", ErrUnknownServer, s.def.Name)
		}
		if err != nil {
			s.failures++
			s.notBefore = time.Now().Add(s.backoff())
			s.startErr = err
		} else {
			s.sess = sess
		}
		close(ch)
		s.mu.Unlock()
		if err != nil && stale == nil && s.pool.cfg.OnStartFailure != nil {
			s.pool.cfg.OnStartFailure(s.def.Name, err)
		}
		if stale != nil {
			_ = stale.c.Close() // never used: its close error tells nothing
		}
		if err != nil {
			return nil, err
		}
	}
}

func (s *slot) release(sess *session) {
	s.mu.Lock()
	sess.inflight--
	sess.lastUsed = time.Now()
	s.mu.Unlock()
}

// backoff is the restart delay after s.failures consecutive failures.
func (s *slot) backoff() time.Duration {
	d := s.pool.cfg.MinBackoff
	for i := 1; i < s.failures && d < s.pool.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, s.pool.cfg.MaxBackoff)
}

// crashedLocked forgets a dead session and schedules the restart.
func (s *slot) crashedLocked(sess *session, why string) {
	if s.sess != sess {
		return
	}
	s.sess = nil
	s.toolCache = nil
	s.failures++
	s.notBefore = time.Now().Add(s.backoff())
	s.pool.log.Warn("MCP server lost: it restarts on next use", "server", s.def.Name, "why", why,
		"restart_in", time.Until(s.notBefore).Round(time.Millisecond), "stderr", sess.stderr.tail())
	go func() { _ = sess.c.Close() }() // the session is lost already: closing only frees what is left of it
}

func (s *slot) start() (*session, error) {
	cfg := s.pool.cfg
	log := s.pool.log.With("server", s.def.Name)
	tail := newTailWriter(log)
	sess := &session{stderr: tail}
	var c *client.Client
	switch {
	case s.def.Remote():
		var err error
		if s.def.Type == "sse" {
			c, err = client.NewSSEMCPClient(s.def.URL, transport.WithHeaders(s.def.Headers))
		} else {
			c, err = client.NewStreamableHttpClient(s.def.URL, transport.WithHTTPHeaders(s.def.Headers))
		}
		if err != nil {
			return nil, fmt.Errorf("MCP server %q at %s: %w", s.def.Name, s.def.URL, err)
		}
	default:
		env := make([]string, 0, len(s.def.Env))
		for k, v := range s.def.Env {
			env = append(env, k+"="+v)
		}
		cmdFunc := func(ctx context.Context, command string, env []string, args []string) (*exec.Cmd, error) {
			cmd := exec.CommandContext(ctx, command, args...)
			cmd.Env = append(os.Environ(), env...)
			cmd.Dir = s.def.Cwd
			setProcessGroup(cmd)
			sess.cmd = cmd
			return cmd, nil
		}
		tr := transport.NewStdioWithOptions(s.def.Command, env, s.def.Args,
			transport.WithCommandFunc(cmdFunc), transport.WithCommandStderrWriter(tail),
			transport.WithCommandLogger(log))
		c = client.NewClient(tr)
	}
	sess.c = c
	// The session outlives this call: it is bound to the pool, not the caller.
	if err := c.Start(s.pool.ctx); err != nil {
		return nil, fmt.Errorf("start MCP server %q (%s): %w%s", s.def.Name, s.describe(), err, tail.hint())
	}
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == mcp.MethodNotificationToolsListChanged {
			s.mu.Lock()
			s.toolCache = nil
			s.toolGen++
			s.mu.Unlock()
			log.Info("tool list changed")
		}
	})
	ictx, cancel := context.WithTimeout(s.pool.ctx, cfg.StartTimeout)
	defer cancel()
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: cfg.ClientName, Version: cfg.Version}
	if _, err := c.Initialize(ictx, init); err != nil {
		_ = c.Close() // closing on the way out: a failure leaves nothing to do
		return nil, fmt.Errorf("initialize MCP server %q (%s): %w%s", s.def.Name, s.describe(), err, tail.hint())
	}
	sess.lastUsed = time.Now()
	log.Info("MCP server session started")
	return sess, nil
}

func (s *slot) describe() string {
	if s.def.Remote() {
		return s.def.URL
	}
	return strings.TrimSpace(s.def.Command + " " + strings.Join(s.def.Args, " "))
}

// lost reports whether err means the session is gone (process exited, pipe
// closed); the session is then forgotten so the next use restarts it.
func (s *slot) lost(sess *session, err error) bool {
	if !errors.Is(err, transport.ErrTransportClosed) && (sess.cmd == nil || processAlive(sess.cmd)) {
		return false
	}
	s.mu.Lock()
	s.crashedLocked(sess, err.Error())
	s.mu.Unlock()
	return true
}

func (s *slot) tools(ctx context.Context) ([]mcp.Tool, error) {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if s.toolCache != nil && s.sess != nil {
			t := s.toolCache
			s.mu.Unlock()
			return t, nil
		}
		s.mu.Unlock()
		sess, err := s.acquire(ctx)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		gen := s.toolGen
		s.mu.Unlock()
		res, err := sess.c.ListTools(ctx, mcp.ListToolsRequest{})
		s.release(sess)
		if err != nil {
			if s.lost(sess, err) && attempt == 0 {
				continue // listing is safe to retry on a fresh session
			}
			return nil, fmt.Errorf("list tools of MCP server %q: %w%s", s.def.Name, err, sess.stderr.hint())
		}
		s.mu.Lock()
		if s.toolGen == gen && s.sess == sess {
			s.toolCache = res.Tools
		}
		s.mu.Unlock()
		return res.Tools, nil
	}
}

func (s *slot) call(ctx context.Context, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	sess, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := sess.c.CallTool(ctx, req)
	s.release(sess)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("call %s.%s: %w", s.def.Name, tool, ctx.Err())
		}
		if s.lost(sess, err) {
			time.Sleep(50 * time.Millisecond) // let the dying server's last stderr lines arrive
			return nil, fmt.Errorf("MCP server %q exited during the call to %s (it is restarted on next use)%s", s.def.Name, tool, sess.stderr.hint())
		}
		return nil, fmt.Errorf("%s.%s: %w", s.def.Name, tool, err)
	}
	s.mu.Lock()
	s.failures = 0
	s.mu.Unlock()
	if res.IsError {
		return res, &ToolError{Server: s.def.Name, Tool: tool, Message: resultText(res)}
	}
	return res, nil
}

func (s *slot) closeIfIdle(idle time.Duration) {
	s.mu.Lock()
	sess := s.sess
	if sess == nil || sess.inflight > 0 || time.Since(sess.lastUsed) < idle {
		s.mu.Unlock()
		return
	}
	s.sess, s.toolCache = nil, nil
	s.mu.Unlock()
	s.pool.log.Info("closing idle MCP server session", "server", s.def.Name, "idle", idle)
	_ = sess.c.Close() // closing on the way out: a failure leaves nothing to do
}

// retire closes s for good: it was removed from the pool. Its session (a
// server process may take a while to exit) closes in the background, owned
// by the pool.
func (s *slot) retire() {
	s.mu.Lock()
	s.gone = true
	sess := s.sess
	s.sess, s.toolCache = nil, nil
	s.mu.Unlock()
	if sess == nil {
		return
	}
	s.pool.wg.Add(1)
	go func() {
		defer s.pool.wg.Done()
		s.pool.log.Debug("closing MCP server session", "server", s.def.Name, "why", "removed or changed in the config")
		_ = sess.c.Close() // retired: a failure leaves nothing to do
	}()
}

func (s *slot) close(why string) {
	s.mu.Lock()
	sess := s.sess
	s.sess, s.toolCache = nil, nil
	s.mu.Unlock()
	if sess != nil {
		s.pool.log.Debug("closing MCP server session", "server", s.def.Name, "why", why)
		_ = sess.c.Close() // closing on the way out: a failure leaves nothing to do
	}
}
