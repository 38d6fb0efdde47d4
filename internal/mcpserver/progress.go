package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// progress sends a call's progress notifications: lifecycle events (queued,
// started, finished) and output lines, numbered in one increasing sequence.
type progress struct {
	ctx   context.Context
	srv   *server.MCPServer
	token mcp.ProgressToken
	max   int

	mu      sync.Mutex // guards step, lines, seen, partial
	step    int
	lines   int
	seen    int               // output bytes looked at
	partial map[string]string // unfinished last line per stream
}

// progressSender returns the request's progress sender, or nil when the client
// sent no progress token.
func progressSender(ctx context.Context, req mcp.CallToolRequest, maxLines int) *progress {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil
	}
	srv := server.ServerFromContext(ctx)
	if srv == nil {
		return nil
	}
	return &progress{ctx: ctx, srv: srv, token: req.Params.Meta.ProgressToken, max: maxLines, partial: map[string]string{}}
}

func (p *progress) sendLocked(msg string) {
	p.step++
	_ = p.srv.SendNotificationToClient(p.ctx, "notifications/progress", map[string]any{ // notifications are best effort: the client may be gone
		"progressToken": p.token,
		"progress":      p.step,
		"message":       msg,
	})
}

// event reports a lifecycle event; nil-safe so it can be passed as Run's progress.
func (p *progress) event(ev jobs.Event) {
	if p == nil {
		return
	}
	msg := string(ev.Kind)
	switch ev.Kind {
	case jobs.EventSubmitted:
		msg = "queued"
	case jobs.EventStarted:
		msg = "started"
		if ev.Worker != "" {
			msg += " on " + ev.Worker
		}
	case jobs.EventFinished:
		if ev.Result != nil {
			msg = "finished: " + string(ev.Result.Status)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ev.Kind == jobs.EventFinished || ev.Kind == jobs.EventCancelled {
		p.flushLocked()
	}
	p.sendLocked(msg)
}

// Bounds of one call's live output notifications, whatever workers publish:
// the bytes of output looked at, and the unfinished line kept per stream.
const (
	maxProgressBytes = 1 << 20
	maxPartialLine   = 1000
)

// output reports live output, one notification per complete line.
func (p *progress) output(stream, data string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stream != "stdout" && stream != "stderr" {
		return
	}
	room := maxProgressBytes - p.seen
	if room <= 0 {
		return
	}
	if len(data) > room {
		data = data[:room]
	}
	p.seen += len(data)
	text := p.partial[stream] + data
	for {
		i := strings.IndexByte(text, '\n')
		if i < 0 {
			break
		}
		p.lineLocked(stream, text[:i])
		text = text[i+1:]
	}
	if len(text) > maxPartialLine {
		text = text[:maxPartialLine] // the line is cut in its notification anyway
	}
	p.partial[stream] = text
}

func (p *progress) flushLocked() {
	for _, stream := range []string{"stdout", "stderr"} {
		if t := p.partial[stream]; t != "" {
			p.lineLocked(stream, t)
			p.partial[stream] = ""
		}
	}
}

func (p *progress) lineLocked(stream, line string) {
	p.lines++
	switch {
	case p.lines < p.max:
		if len(line) > 1000 {
			line = line[:1000] + "…"
		}
		p.sendLocked(stream + ": " + line)
	case p.lines == p.max:
		p.sendLocked(fmt.Sprintf("(more output: progress shows the first %d lines; the result has it all)", p.max-1))
	}
}
