package mcpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// ServeStdio serves srv, with its task layer, on stdin and stdout until stdin
// ends. When ctx ends first, in-flight calls get grace (drain is called with
// it) before the session ends: ending it would cancel their jobs.
func ServeStdio(ctx context.Context, srv *server.MCPServer, tasks *Tasks, drain func(context.Context), grace time.Duration, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	// Task methods are answered in front of mcp-go, from the state service.
	if tasks != nil {
		stdin, stdout = tasks.Stdio(stdin, stdout)
	}
	s := server.NewStdioServer(srv)
	s.SetErrorLogger(slog.NewLogLogger(log.Handler(), slog.LevelError))
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer lcancel()
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			drain(dctx)
			lcancel()
		case <-lctx.Done():
		}
	}()
	err := s.Listen(lctx, stdin, stdout)
	lcancel()
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// ServeHTTP serves h on ln until ctx ends. Then in-flight calls get grace to
// receive their job's outcome (drain is called with it), or an answer naming
// the job id to fetch it with later, and the connections are shut down.
// Reads, headers and idle connections are bounded; writes are not: /mcp
// streams results and /api/jobs/{id}/wait may wait minutes.
func ServeHTTP(ctx context.Context, ln net.Listener, h http.Handler, drain func(context.Context), grace time.Duration, log *slog.Logger) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("front-end stopping: answering in-flight calls", "grace", grace)
	dctx, dcancel := context.WithTimeout(context.Background(), grace)
	defer dcancel()
	drained := make(chan struct{})
	go func() { drain(dctx); close(drained) }()
	sctx, cancel := context.WithTimeout(context.Background(), grace+5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("HTTP connections still open after the grace period: closing them", "err", err)
		_ = hs.Close() // closing on the way out: a failure leaves nothing to do
	}
	<-drained
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		log.Warn("HTTP server stopped with an error", "err", err)
	}
	return nil
}
