package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestNatsLogLevels: nats-server's warnings and errors reach the broker's
// log at their levels, its notices only at debug, its chosen-payload warning
// not at all above debug.
func TestNatsLogLevels(t *testing.T) {
	var buf bytes.Buffer
	l := natsLog{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	l.Noticef("Starting nats-server")
	l.Warnf("Filestore [%s] Stream state outdated, will rebuild", "S-R3F-x")
	l.Errorf("JetStream stream %q critical write error", "MCPEXEC_EVENTS")
	l.Warnf("Maximum payloads over 8.00 MB are generally discouraged")
	out := buf.String()
	for _, want := range []string{`level=WARN msg="Filestore [S-R3F-x] Stream state outdated, will rebuild" component=nats-server`,
		`level=ERROR msg="JetStream stream \"MCPEXEC_EVENTS\" critical write error"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	for _, not := range []string{"Starting", "Maximum payloads"} {
		if strings.Contains(out, not) {
			t.Errorf("log %q holds %q above debug", out, not)
		}
	}
}
