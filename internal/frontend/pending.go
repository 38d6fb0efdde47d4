package frontend

import (
	"context"
	"errors"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// pendingRecordWait bounds how long Get waits for the state service to apply
// a submission that is already in the events stream.
const pendingRecordWait = 5 * time.Second

// recordPending reports whether job id's submission is in the events stream.
func (f *Frontend) recordPending(ctx context.Context, id string) bool {
	sub := f.cfg.Subjects
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := f.nc.RequestWithContext(ctx, sub.DirectGet(sub.EventsStream(), sub.Event(id, jobs.EventSubmitted)), nil)
	return err == nil && msg.Header.Get("Status") == ""
}

// awaitRecord is called when the state service has no record of id: when the
// id's submission is in the events stream (the state service applies it
// within moments) it waits for the record, so a look-up right after a submit
// never answers "not found". Otherwise it returns state.ErrNotFound.
func (f *Frontend) awaitRecord(ctx context.Context, id string) (*jobs.Record, error) {
	if !f.recordPending(ctx, id) {
		return nil, state.ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, pendingRecordWait)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return nil, state.ErrNotFound
		case <-time.After(10 * time.Millisecond):
		}
		rec, err := f.state.Job(ctx, id)
		if !errors.Is(err, state.ErrNotFound) {
			return rec, err
		}
	}
}
