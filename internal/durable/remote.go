package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// MaxWaiting bounds the barrier requests a server holds at once: more are
// answered with an error at once (the caller retries).
const MaxWaiting = 4096

// passTimeout bounds what one request waits for its pass.
const passTimeout = 30 * time.Second

// Server answers barrier requests on a subject with a Barrier: an empty
// answer once it synced, or an error text.
type Server struct {
	b   Barrier
	sub *nats.Subscription
	sem chan struct{}
	wg  sync.WaitGroup
	ctx context.Context
	end context.CancelFunc
}

// Serve answers requests on subject (any body; a reply subject needed) with b.
func Serve(nc *nats.Conn, subject string, b Barrier) (*Server, error) {
	s := &Server{b: b, sem: make(chan struct{}, MaxWaiting)}
	s.ctx, s.end = context.WithCancel(context.Background())
	sub, err := nc.Subscribe(subject, s.handle)
	if err != nil {
		s.end()
		return nil, fmt.Errorf("serve sync barriers on %s: %w", subject, err)
	}
	s.sub = sub
	return s, nil
}

func (s *Server) handle(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		_ = m.Respond([]byte("too many sync requests waiting: retry"))
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.sem }()
		ctx, cancel := context.WithTimeout(s.ctx, passTimeout)
		defer cancel()
		var answer []byte
		if err := SyncStream(ctx, s.b, string(m.Data)); err != nil {
			answer = []byte(err.Error())
		}
		_ = m.Respond(answer)
	}()
}

// Stop stops answering and waits for the requests being served.
func (s *Server) Stop() {
	_ = s.sub.Unsubscribe()
	s.end()
	s.wg.Wait()
}

// StreamBarrier is a Barrier that can make the writes to one stream
// durable alone (Syncer): what a request that names a stream gets.
type StreamBarrier interface {
	SyncStream(ctx context.Context, stream string) error
}

// SyncStream returns once b has made the writes to stream durable: by a
// pass over that stream alone where b can scope one (StreamBarrier) and a
// stream is named, else by b's Sync.
func SyncStream(ctx context.Context, b Barrier, stream string) error {
	if sb, ok := b.(StreamBarrier); ok && stream != "" {
		return sb.SyncStream(ctx, stream)
	}
	return b.Sync(ctx)
}

// Client is the Barrier of a broker reached over NATS: concurrent callers
// share one request.
type Client struct {
	nc      *nats.Conn
	subject string
	stream  string // named in each request, when set
	g       group
}

// NewClient returns the Barrier served on subject.
func NewClient(nc *nats.Conn, subject string) *Client { return &Client{nc: nc, subject: subject} }

// NewStreamClient returns the Barrier served on subject for the writes to
// stream: its requests name the stream, and a broker that can syncs that
// stream's files alone.
func NewStreamClient(nc *nats.Conn, subject, stream string) *Client {
	return &Client{nc: nc, subject: subject, stream: stream}
}

// requestWait bounds one barrier request.
const requestWait = 10 * time.Second

// reconnectPoll is how often a barrier request in flight checks its
// connection.
const reconnectPoll = 50 * time.Millisecond

// abandonOnReconnect calls cancel if the connection drops or reconnects
// before stop is called: the request went to a broker that is gone, and
// its answer will never come (nats.go does not fail a request in flight
// on a reconnect). Without it, every writer of the client waited out
// requestWait after a broker's power cut (TestOneNodePowerCut: new jobs
// ran 8-9 s after the restart).
func (c *Client) abandonOnReconnect(cancel context.CancelFunc) (stop func()) {
	was := c.nc.Stats().Reconnects
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(reconnectPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if !c.nc.IsConnected() || c.nc.Stats().Reconnects != was {
					cancel()
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// Sync returns once the broker synced after the call (a request sent after
// it was answered with nothing).
func (c *Client) Sync(ctx context.Context) error {
	return c.g.wait(ctx, func() error {
		rctx, cancel := context.WithTimeout(context.Background(), requestWait)
		defer cancel()
		stop := c.abandonOnReconnect(cancel)
		msg, err := c.nc.RequestWithContext(rctx, c.subject, []byte(c.stream))
		stop()
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("no broker answers sync barriers on %s: %w", c.subject, err)
		}
		if err != nil {
			return fmt.Errorf("sync barrier %s: %w", c.subject, err)
		}
		if len(msg.Data) > 0 {
			return fmt.Errorf("sync barrier %s: %.200s", c.subject, msg.Data)
		}
		return nil
	})
}
