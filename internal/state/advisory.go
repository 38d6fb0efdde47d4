package state

// Jobs whose message exhausted its deliveries: JetStream's advisory, and
// the dead-letter outcome the service records for them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// maxDeliveriesAdvisory is the subject JetStream announces a job message that
// exhausted MaxDeliver on.
func maxDeliveriesAdvisory(sub jobs.Subjects) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + sub.JobsStream() + ".*"
}

type maxDeliveries struct {
	Stream     string `json:"stream"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// advisoryLoop turns a job message that JetStream gave up on (its workers kept
// dying or failing to record it) into a recorded worker_lost dead letter, and
// deletes the message, which a work queue would otherwise keep for ever.
func (s *Service) advisoryLoop(ctx context.Context, advisories <-chan *nats.Msg) {
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return
		case m = <-advisories:
		}
		var a maxDeliveries
		if err := json.Unmarshal(m.Data, &a); err != nil || a.StreamSeq == 0 {
			continue
		}
		if err := s.giveUp(ctx, a); err != nil {
			s.logger.Error("record job that exhausted its deliveries", "seq", a.StreamSeq, "err", err)
		}
	}
}

func (s *Service) giveUp(ctx context.Context, a maxDeliveries) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, s.sub.JobsStream())
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, a.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already handled
	}
	if err != nil {
		return err
	}
	var job jobs.Job
	if err := json.Unmarshal(raw.Data, &job); err == nil && jobs.ValidID(job.ID) {
		ev := jobs.Event{Job: job.ID, Kind: jobs.EventFinished, Attempt: a.Deliveries, At: time.Now().UTC(),
			Result: &jobs.Result{Status: jobs.StatusWorkerLost, Attempt: a.Deliveries,
				Error: fmt.Sprintf("the job message was delivered %d times without a recorded result; kept as a dead letter", a.Deliveries)}}
		ev.Proof = jobs.EventProof(jobs.Capability(s.key, job.ID), ev.Kind, ev.Attempt)
		data, _ := json.Marshal(ev)
		msgID := fmt.Sprintf("%s.%s.%d", ev.Job, ev.Kind, ev.Attempt)
		if _, err := s.js.Publish(ctx, s.sub.Event(job.ID, jobs.EventFinished), data, jetstream.WithMsgID(msgID)); err != nil {
			return fmt.Errorf("record worker_lost of %s: %w", job.ID, err)
		}
		// Durable before the job's message goes.
		if err := s.sync(ctx); err != nil {
			return fmt.Errorf("record worker_lost of %s: %w", job.ID, err)
		}
	}
	if err := stream.DeleteMsg(ctx, a.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete exhausted job message %d: %w", a.StreamSeq, err)
	}
	return nil
}
