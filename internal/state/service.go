package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Error codes answered on request/reply (Nats-Service-Error-Code).
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeInternal   = "500"
)

// Service applies the events stream to the Store and answers state requests.
type Service struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *Store
	sub    jobs.Subjects
	logger *slog.Logger

	mu     sync.Mutex // guards cancel, svc
	cancel context.CancelFunc
	svc    micro.Service
	wg     sync.WaitGroup
}

// NewService returns a Service; Start begins its work.
func NewService(nc *nats.Conn, store *Store, sub jobs.Subjects, logger *slog.Logger) (*Service, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Service{nc: nc, js: js, store: store, sub: sub, logger: logger}, nil
}

// Start creates the service's durable consumer on the events stream, begins
// applying events, and registers the request handlers.
func (s *Service) Start(ctx context.Context) error {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.sub.EventsStream(), jetstream.ConsumerConfig{
		Durable:       "state",
		Description:   "mcpexec state service",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 20_000,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("create state consumer: %w", err)
	}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        s.sub.StateService(),
		Version:     "0.1.0",
		Description: "mcpexec job records and memory",
	})
	if err != nil {
		return fmt.Errorf("add state service: %w", err)
	}
	if err := svc.AddEndpoint("job_get", micro.HandlerFunc(s.handleJobGet),
		micro.WithEndpointSubject(s.sub.State("job.get"))); err != nil {
		svc.Stop()
		return fmt.Errorf("add job.get endpoint: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.cancel, s.svc = cancel, svc
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.applyLoop(runCtx, cons)
	}()
	return nil
}

// Stop ends the service and waits for its goroutines. It is idempotent.
func (s *Service) Stop() {
	s.mu.Lock()
	cancel, svc := s.cancel, s.svc
	s.cancel, s.svc = nil, nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if svc != nil {
		_ = svc.Stop()
	}
	s.wg.Wait()
}

// applyLoop fetches events in batches and applies each batch in one transaction,
// acknowledging them only after the commit. When nothing is pending it blocks on a
// fetch of one event, so an event is applied as soon as it arrives.
func (s *Service) applyLoop(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		batch, err := cons.FetchNoWait(512)
		if err != nil {
			s.sleep(ctx, time.Second)
			continue
		}
		msgs, evs := s.decode(batch)
		if len(msgs) == 0 {
			one, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				s.sleep(ctx, 100*time.Millisecond)
				continue
			}
			if msgs, evs = s.decode(one); len(msgs) == 0 {
				continue
			}
		}
		if _, err := s.store.ApplyEvents(evs); err != nil {
			s.logger.Error("apply events", "count", len(evs), "err", err)
			for _, m := range msgs {
				_ = m.NakWithDelay(time.Second)
			}
			continue
		}
		for _, m := range msgs {
			_ = m.Ack()
		}
	}
}

// decode reads a batch, terminating events that do not decode.
func (s *Service) decode(batch jetstream.MessageBatch) ([]jetstream.Msg, []jobs.Event) {
	var msgs []jetstream.Msg
	var evs []jobs.Event
	for m := range batch.Messages() {
		var ev jobs.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !jobs.ValidID(ev.Job) {
			s.logger.Warn("dropping malformed event", "subject", m.Subject(), "err", err)
			_ = m.TermWithReason("malformed event")
			continue
		}
		msgs = append(msgs, m)
		evs = append(evs, ev)
	}
	return msgs, evs
}

func (s *Service) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// JobGetRequest is the body of a job.get request.
type JobGetRequest struct {
	ID string `json:"id"`
}

func (s *Service) handleJobGet(req micro.Request) {
	var r JobGetRequest
	if err := json.Unmarshal(req.Data(), &r); err != nil || r.ID == "" {
		_ = req.Error(CodeBadRequest, "job.get needs a JSON body {\"id\": \"<job id>\"}", nil)
		return
	}
	rec, err := s.store.Job(r.ID)
	if errors.Is(err, ErrNotFound) {
		_ = req.Error(CodeNotFound, fmt.Sprintf("no job with id %q", r.ID), nil)
		return
	}
	if err != nil {
		_ = req.Error(CodeInternal, err.Error(), nil)
		return
	}
	_ = req.RespondJSON(rec)
}
