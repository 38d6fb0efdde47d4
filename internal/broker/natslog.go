package broker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// natsLog passes nats-server's own log to the broker's: its warnings and
// errors (a damaged stream file it truncated, a Raft group that lost its
// quorum) at their levels, its notices at debug (it tells every step of its
// start).
type natsLog struct{ l *slog.Logger }

func (n natsLog) log(level slog.Level, format string, v ...any) {
	if !n.l.Enabled(context.Background(), level) {
		return
	}
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	if strings.HasPrefix(msg, "Maximum payloads over") {
		level = slog.LevelDebug // MaxPayload is chosen: results and proxy frames are large
	}
	n.l.Log(context.Background(), level, msg, "component", "nats-server")
}

func (n natsLog) Noticef(format string, v ...any) { n.log(slog.LevelDebug, format, v...) }
func (n natsLog) Warnf(format string, v ...any)   { n.log(slog.LevelWarn, format, v...) }
func (n natsLog) Fatalf(format string, v ...any)  { n.log(slog.LevelError, format, v...) }
func (n natsLog) Errorf(format string, v ...any)  { n.log(slog.LevelError, format, v...) }
func (n natsLog) Debugf(format string, v ...any)  {}
func (n natsLog) Tracef(format string, v ...any)  {}
