package proxyresp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Approval is a proxied call parked until a person answers it (jobs.Approval).
type Approval = jobs.Approval

// Approval states.
const (
	approvalPending   = "pending"
	approvalApproved  = "approved"
	approvalDenied    = "denied"
	approvalTimedOut  = "timed_out"
	approvalWithdrawn = "withdrawn" // the job ended, or its time ran out, first
)

// Decisions a person may give.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// approvalEntry is an approval's record in the approvals bucket.
type approvalEntry struct {
	Approval
	Namespace string     `json:"namespace"`
	Frontend  string     `json:"frontend"`
	State     string     `json:"state"`
	DecidedBy string     `json:"decided_by,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	// Scope is "job" or "namespace" for an approval widened into a grant.
	Scope string `json:"scope,omitempty"`
	// JobKey tells the job's submissions apart (a job id may be submitted
	// again once its record is gone): a job grant holds for one of them.
	JobKey string `json:"job_key,omitempty"`

	rev uint64 // the bucket's revision of the entry as read (not stored)
}

// Bounds of approvals.
const (
	// maxListedApprovals bounds the entries a listing or a cap check reads.
	maxListedApprovals = 1000
	approvalIDBytes    = 16
)

// ErrApprovalsUnavailable is returned when the approvals bucket cannot be
// used (a broker that predates approvals, or none reachable).
var ErrApprovalsUnavailable = errors.New("approvals are unavailable")

// approvals parks calls in the approvals bucket and answers them; any
// front-end of the fleet can list and answer any parked call.
type approvals struct {
	js  jetstream.JetStream
	sub jobs.Subjects
	id  string // this front-end's
	// durable makes an answer or a revocation durable before it is
	// confirmed (the brokers' barrier, where they need one).
	durable durable.Barrier

	mu sync.Mutex // guards kv
	kv jetstream.KeyValue
	// parkMu makes this front-end's cap checks and records one at a time.
	parkMu sync.Mutex

	localMu  sync.Mutex     // guards localNS, localJob
	localNS  map[string]int // calls waiting on this front-end, by namespace
	localJob map[string]int // ... by job (wire id)
}

// reserve counts one more call of job in namespace ns waiting on this
// front-end, unless this front-end alone already holds a cap's worth: then
// the call is refused without reading the bucket (a job looping over asks
// costs the fleet nothing). release undoes it.
func (a *approvals) reserve(ns, job string, lim ApprovalLimits) (release func(), err error) {
	a.localMu.Lock()
	defer a.localMu.Unlock()
	if a.localNS == nil {
		a.localNS, a.localJob = map[string]int{}, map[string]int{}
	}
	switch {
	case a.localJob[job] >= lim.PerJob:
		return nil, fmt.Errorf("%w: this job already has %d calls waiting for approval, the most namespace %q's policy allows (max_pending_approvals_per_job): await them first", errOverCap, a.localJob[job], ns)
	case a.localNS[ns] >= lim.PerNamespace:
		return nil, fmt.Errorf("%w: namespace %q already has %d calls waiting for approval, the most its policy allows (max_pending_approvals): answer some first", errOverCap, ns, a.localNS[ns])
	}
	a.localNS[ns]++
	a.localJob[job]++
	return func() {
		a.localMu.Lock()
		defer a.localMu.Unlock()
		if a.localNS[ns]--; a.localNS[ns] == 0 {
			delete(a.localNS, ns)
		}
		if a.localJob[job]--; a.localJob[job] == 0 {
			delete(a.localJob, job)
		}
	}, nil
}

func newApprovals(nc *nats.Conn, sub jobs.Subjects, id string) *approvals {
	js, _ := jetstream.New(nc) // fails only for a nil connection
	return &approvals{js: js, sub: sub, id: id, durable: durable.NewFleet(nc, sub.StateService(), sub.SyncBarrier())}
}

// bucket opens the approvals bucket once.
func (a *approvals) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.kv != nil {
		return a.kv, nil
	}
	if a.js == nil {
		return nil, ErrApprovalsUnavailable
	}
	kv, err := a.js.KeyValue(ctx, a.sub.ApprovalsBucket())
	if err != nil {
		return nil, &errs.Error{Kind: errs.Unavailable, Msg: fmt.Sprintf("%v: open bucket %s (is the broker up to date?)", ErrApprovalsUnavailable, a.sub.ApprovalsBucket()), Err: err}
	}
	a.kv = kv
	return kv, nil
}

// newApprovalID is 128 random bits, in hex.
func newApprovalID() string {
	var b [approvalIDBytes]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// validApprovalID reports whether id has the form newApprovalID gives.
func validApprovalID(id string) bool {
	if len(id) != 2*approvalIDBytes {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// shownArgs is what an approval shows of args (their JSON).
func shownArgs(args map[string]any) (shown json.RawMessage, truncated bool, size int, digest string) {
	data, err := json.Marshal(args)
	if err != nil {
		data = []byte("{}")
	}
	sum := sha256.Sum256(data)
	if len(data) <= jobs.MaxApprovalArgs {
		return data, false, len(data), hex.EncodeToString(sum[:])
	}
	cut, _ := json.Marshal(errs.Clip(string(data), jobs.MaxApprovalArgs))
	return cut, true, len(data), hex.EncodeToString(sum[:])
}

// entries reads namespace ns's entries (at most maxListedApprovals).
func (a *approvals) entries(ctx context.Context, kv jetstream.KeyValue, ns string) ([]approvalEntry, error) {
	out, err := readEntries(ctx, kv, a.sub.ApprovalKeys(ns), func(key string, e jetstream.KeyValueEntry, ent *approvalEntry) bool {
		ent.rev = e.Revision()
		return ent.Namespace == ns && a.sub.ApprovalKey(ns, ent.ID) == key
	})
	if err != nil {
		return nil, fmt.Errorf("list approvals of %s: %w", ns, err)
	}
	return out, nil
}

// readEntries decodes the bucket's entries under filter, at most
// maxListedApprovals of them, keeping those keep accepts (it may also fill
// in what the value does not carry). An entry deleted meanwhile, or one
// that does not decode, is skipped.
func readEntries[T any](ctx context.Context, kv jetstream.KeyValue, filter string, keep func(key string, e jetstream.KeyValueEntry, v *T) bool) ([]T, error) {
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var out []T
	for key := range lister.Keys() {
		if len(out) == maxListedApprovals {
			_ = lister.Stop() // enough
			break
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue // gone meanwhile
		}
		var v T
		if json.Unmarshal(e.Value(), &v) == nil && keep(key, e, &v) {
			out = append(out, v)
		}
	}
	return out, nil
}

// waiting reports whether ent still waits for an answer at now (a pending
// entry past its expiry was left by a front-end that died holding it).
func (ent *approvalEntry) waiting(now time.Time) bool {
	return ent.State == approvalPending && now.Before(ent.ExpiresAt)
}

// List returns namespace ns's calls waiting for an answer, oldest first.
func (a *approvals) List(ctx context.Context, ns string) ([]Approval, error) {
	ns = jobs.NamespaceOf(ns)
	kv, err := a.bucket(ctx)
	if err != nil {
		return nil, err
	}
	ents, err := a.entries(ctx, kv, ns)
	if err != nil {
		return nil, &errs.Error{Kind: errs.Unavailable, Msg: "list approvals", Err: err}
	}
	out := []Approval{}
	now := time.Now()
	for _, e := range ents {
		if e.waiting(now) {
			out = append(out, e.Approval)
		}
	}
	slices.SortFunc(out, func(x, y Approval) int { return x.AskedAt.Compare(y.AskedAt) })
	return out, nil
}

// errNoApproval is the answer for an id that is not one of the caller's
// namespace's, whether or not it exists elsewhere.
func errNoApproval(id string) error {
	return errs.New(errs.NotFound, fmt.Sprintf("no such approval %q", errs.Clip(id, 40)))
}

// Decide answers namespace ns's approval id with ans, by who. The first
// answer wins: a later one, or one for a call no longer waiting, gets a
// Conflict error saying what happened. An approval whose scope is "job" or
// "namespace" also records a Grant (returned), which allows the later
// calls it covers without asking, and approves those of them already
// waiting.
func (a *approvals) Decide(ctx context.Context, ns, id string, ans jobs.ApprovalAnswer, by string) (Approval, *jobs.Grant, error) {
	ap, g, err := a.decide(ctx, ns, id, ans, by)
	if ap.ID != "" {
		// The answer was recorded: durable before the person hears it.
		if serr := a.sync(ctx); serr != nil && err == nil {
			err = &errs.Error{Kind: errs.Unavailable, Msg: fmt.Sprintf("approval %s was answered, but the answer is not yet on disk (a power cut now could undo it): read GET /api/approvals to see whether it stands", id), Err: serr}
		}
	}
	return ap, g, err
}

// sync makes what the bucket acknowledged durable (durable).
func (a *approvals) sync(ctx context.Context) error {
	if a.durable == nil {
		return nil
	}
	return a.durable.Sync(ctx)
}

func (a *approvals) decide(ctx context.Context, ns, id string, ans jobs.ApprovalAnswer, by string) (Approval, *jobs.Grant, error) {
	ns = jobs.NamespaceOf(ns)
	if err := ans.Validate(); err != nil {
		return Approval{}, nil, errs.New(errs.Invalid, err.Error())
	}
	if !validApprovalID(id) {
		return Approval{}, nil, errNoApproval(id)
	}
	kv, err := a.bucket(ctx)
	if err != nil {
		return Approval{}, nil, err
	}
	key := a.sub.ApprovalKey(ns, id)
	for range 3 {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Approval{}, nil, errNoApproval(id)
		}
		if err != nil {
			return Approval{}, nil, &errs.Error{Kind: errs.Unavailable, Msg: "read approval", Err: err}
		}
		var ent approvalEntry
		if json.Unmarshal(e.Value(), &ent) != nil || ent.Namespace != ns || ent.ID != id {
			return Approval{}, nil, errNoApproval(id)
		}
		now := time.Now().UTC()
		if !ent.waiting(now) {
			return Approval{}, nil, errs.New(errs.Conflict, settledMessage(&ent, now))
		}
		ent.State, ent.DecidedBy, ent.Reason, ent.DecidedAt = approvalDenied, by, ans.Reason, &now
		if ans.Decision == DecisionApprove {
			ent.State = approvalApproved
		}
		if ans.Scope != jobs.ScopeCall {
			ent.Scope = ans.Scope
		}
		data, _ := json.Marshal(ent) // plain types always encode
		if _, err := kv.Update(ctx, key, data, e.Revision()); err != nil {
			if isWrongRevision(err) {
				continue // answered meanwhile: say by whom
			}
			return Approval{}, nil, &errs.Error{Kind: errs.Unavailable, Msg: "record the answer", Err: err}
		}
		if ent.Scope == "" {
			return ent.Approval, nil, nil
		}
		g, err := a.grant(ctx, kv, &ent, ans, by, now)
		if err != nil {
			return ent.Approval, nil, &errs.Error{Kind: errs.Unavailable, Msg: fmt.Sprintf("approval %s is approved, but its %s grant could not be recorded: approve the next calls one by one", id, ans.Scope), Err: err}
		}
		return ent.Approval, g, nil
	}
	return Approval{}, nil, errs.New(errs.Conflict, "the approval kept changing while it was answered: read GET /api/approvals again")
}

// settledMessage says why ent no longer waits for an answer.
func settledMessage(ent *approvalEntry, now time.Time) string {
	when := func() string {
		if ent.DecidedAt != nil {
			return ent.DecidedAt.Format(time.RFC3339)
		}
		return ent.ExpiresAt.Format(time.RFC3339)
	}
	switch ent.State {
	case approvalApproved, approvalDenied:
		return fmt.Sprintf("approval %s was already answered (%s by %s at %s): the first answer wins", ent.ID, ent.State, ent.DecidedBy, when())
	case approvalTimedOut:
		return fmt.Sprintf("approval %s timed out at %s: the call was denied, and an approval answers only the call it was asked for", ent.ID, when())
	case approvalWithdrawn:
		return fmt.Sprintf("approval %s is no longer waiting: its job ended or ran out of time at %s", ent.ID, when())
	}
	if !now.Before(ent.ExpiresAt) {
		return fmt.Sprintf("approval %s timed out at %s: the call was denied", ent.ID, ent.ExpiresAt.Format(time.RFC3339))
	}
	return fmt.Sprintf("approval %s is %s", ent.ID, ent.State)
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Approvals returns namespace ns's calls waiting for a person's approval,
// oldest first, wherever in the fleet they are parked.
func (r *Responder) Approvals(ctx context.Context, ns string) ([]Approval, error) {
	return r.approvals.List(ctx, ns)
}

// DecideApproval answers namespace ns's approval id for its one call:
// decision is "approve" or "deny", by says who answered, reason is
// optional. An id that is not one of ns's is NotFound; one already
// answered, timed out or withdrawn is Conflict.
func (r *Responder) DecideApproval(ctx context.Context, ns, id, decision, by, reason string) (Approval, error) {
	ap, _, err := r.approvals.Decide(ctx, ns, id, jobs.ApprovalAnswer{Decision: decision, Reason: reason}, by)
	return ap, err
}

// AnswerApproval answers namespace ns's approval id with ans, which may
// widen an approval into a grant (returned); see DecideApproval.
func (r *Responder) AnswerApproval(ctx context.Context, ns, id string, ans jobs.ApprovalAnswer, by string) (Approval, *jobs.Grant, error) {
	return r.approvals.Decide(ctx, ns, id, ans, by)
}

// FollowApprovals calls fn with each approval of namespace ns asked or
// answered from now on, anywhere in the fleet, until ctx ends or fn fails.
func (r *Responder) FollowApprovals(ctx context.Context, ns string, fn func(jobs.ApprovalEvent) error) error {
	return r.approvals.Follow(ctx, ns, fn)
}

// Follow implements Responder.FollowApprovals.
func (a *approvals) Follow(ctx context.Context, ns string, fn func(jobs.ApprovalEvent) error) error {
	ns = jobs.NamespaceOf(ns)
	kv, err := a.bucket(ctx)
	if err != nil {
		return err
	}
	w, err := kv.Watch(ctx, a.sub.ApprovalKeys(ns), jetstream.UpdatesOnly())
	if err != nil {
		return &errs.Error{Kind: errs.Unavailable, Msg: "follow approvals", Err: err}
	}
	defer func() { _ = w.Stop() }() // a watch of a closed connection is gone anyway
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return &errs.Error{Kind: errs.Unavailable, Msg: "the approvals watch ended: reconnect"}
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var ent approvalEntry
			if json.Unmarshal(e.Value(), &ent) != nil || ent.Namespace != ns || a.sub.ApprovalKey(ns, ent.ID) != e.Key() {
				continue
			}
			ev := jobs.ApprovalEvent{Kind: jobs.ApprovalAnswered, State: ent.State, DecidedBy: ent.DecidedBy, Reason: ent.Reason, Scope: ent.Scope, Approval: ent.Approval}
			if ent.State == approvalPending {
				ev.Kind = jobs.ApprovalAsked
			}
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
}
