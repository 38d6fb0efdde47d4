package mcpserver

// The task layer's place in front of mcp-go: on HTTP, a handler that claims
// the task requests; on stdio, a filter of the lines.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/httperr"
)

// HTTP returns next with the task layer in front of it: a POST whose body is
// a request the layer claims is answered here with a JSON response; anything
// else goes on to next (mcp-go's streamable HTTP server). The body must
// already be bounded (guard does it).
func (t *Tasks) HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				httperr.Write(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the request body is over %d bytes: send less code", tooBig.Limit))
				return
			}
			httperr.Write(w, http.StatusBadRequest, "bad_body", "reading the request body: "+err.Error())
			return
		}
		req, ok := t.claims(body)
		if !ok {
			body = t.withoutLegacyTask(body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			next.ServeHTTP(w, r)
			return
		}
		var out []byte
		var code int
		if req.era.modern {
			if herr := modernHeaders(r.Header, req); herr != nil {
				out, code = t.answer(req, nil, herr)
			}
		}
		if out == nil {
			out, code = t.handle(r.Context(), r.Header.Get(server.HeaderKeySessionID), req)
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req.era.modern:
			// 2026-07-28 gives each error its HTTP status.
			w.WriteHeader(modernStatus(code))
		case code == mcp.MISSING_REQUIRED_CLIENT_CAPABILITY:
			w.WriteHeader(http.StatusBadRequest)
		}
		_, _ = w.Write(out) // a client that went away has nothing to read
	})
}

// Stdio puts the task layer between a stdio client and mcp-go's stdio server:
// it reads the client's messages from in, answers those it claims on out
// (each in its own goroutine: tasks/result waits), and passes the rest on
// through the returned reader. Give mcp-go the returned writer too: it
// serialises both writers' messages, one whole line at a time. The reader
// ends when in does.
func (t *Tasks) Stdio(in io.Reader, out io.Writer) (io.Reader, io.Writer) {
	lw := &lineWriter{w: out}
	pr, pw := io.Pipe()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		br := bufio.NewReaderSize(in, 64<<10)
		for {
			line, err := readLine(br, maxStdioMessageSize)
			if len(line) > 0 {
				if req, ok := t.claims(line); ok {
					t.wg.Add(1)
					go func() {
						defer t.wg.Done()
						out, _ := t.handle(t.ctx, stdioSessionID, req)
						_, _ = lw.Write(append(out, '\n')) // the client went away: nothing to tell it
					}()
				} else if _, werr := pw.Write(t.withoutLegacyTask(line)); werr != nil {
					return
				}
			}
			if err != nil {
				_ = pw.CloseWithError(err) // never fails
				return
			}
		}
	}()
	return pr, lw
}

// stdioSessionID is the id mcp-go gives the one stdio session.
const stdioSessionID = "stdio"

// readLine returns the next line of br with its newline. A line over max
// bytes is read to its end and dropped whole: what is returned for it is a
// line that never parses as a message (mcp-go answers a parse error), never a
// part of it, nor its start joined to its end.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	over := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !over && len(line)+len(chunk) > max {
			over, line = true, nil
		}
		if !over {
			line = append(line, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if over {
				line = fmt.Appendf(nil, "<a message over %d bytes was dropped>\n", max)
			}
			return line, err
		}
	}
}

// lineWriter serialises whole-message writes from several writers.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
