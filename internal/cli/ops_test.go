package cli

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestServeOps(t *testing.T) {
	var health error = errors.New("not connected to NATS")
	addr, stop, err := ServeOps("127.0.0.1:0", func() error { return health }, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "mcpexec_up 1\n")
	}), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 503 || !strings.Contains(body, "not connected to NATS") {
		t.Fatalf("unhealthy: %d %s", code, body)
	}
	health = nil
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("healthy: %d %s", code, body)
	}
	if code, body := get("/metrics"); code != 200 || body != "mcpexec_up 1\n" {
		t.Fatalf("metrics: %d %s", code, body)
	}
	if _, _, err := ServeOps("127.0.0.1:bad", func() error { return nil }, nil, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--http") {
		t.Fatalf("bad address: %v", err)
	}
}
