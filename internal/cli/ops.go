package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ServeOps serves the operator endpoints on addr: GET /healthz (200 when health
// returns nil, else 503 with the reason) and GET /metrics. It returns the bound
// address once the listener is open; stop closes it.
func ServeOps(addr string, health func() error, metrics http.Handler, log *slog.Logger) (bound string, stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := health(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": err.Error()}) // the client went away: nothing to tell it
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"}) // the client went away: nothing to tell it
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listen on --http %s: %w (is the port in use?)", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("operator HTTP endpoint failed", "addr", addr, "err", err)
		}
	}()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
