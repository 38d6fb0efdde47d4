package mcpclients

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// tailWriter logs a child's stderr line by line and keeps its last lines, so an
// error about the server can say what the server said.
type tailWriter struct {
	log *slog.Logger

	mu    sync.Mutex // guards buf, lines
	buf   []byte
	lines []string
}

const tailLines = 8

func newTailWriter(log *slog.Logger) *tailWriter { return &tailWriter{log: log} }

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 4096 { // a very long line: log it in pieces
		w.line(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *tailWriter) line(l string) {
	l = strings.TrimRight(l, "\r")
	if l == "" {
		return
	}
	w.log.Info("MCP server stderr", "line", l)
	w.lines = append(w.lines, l)
	if len(w.lines) > tailLines {
		w.lines = w.lines[len(w.lines)-tailLines:]
	}
}

// tail returns the last lines written.
func (w *tailWriter) tail() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// hint is tail formatted to end an error message, or "".
func (w *tailWriter) hint() string {
	if t := w.tail(); t != "" {
		return "; its stderr ends with: " + t
	}
	return ""
}
