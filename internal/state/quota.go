package state

import "sync"

// reservations are the memory quota a replica has granted to writes it has
// checked but not yet folded into its store. A write is checked against the
// store's usage plus its namespace's reservations, and reserves what it adds
// in the same step (under mu), so concurrent writes that each fit alone cannot
// together pass the quota: each sees the others' bytes before they are folded.
// A reservation ends when the replica folds its write (found by its stream
// sequence), or when the write is not published. It may briefly count a
// write twice (folded, not yet released), which refuses early, never late.
//
// The bound holds per replica: writes of one namespace checked at the same
// moment by two replicas each see only their own reservations.
type reservations struct {
	mu      sync.Mutex
	pending map[string]int64        // namespace -> bytes granted, not yet folded
	bySeq   map[uint64]*reservation // published writes, by stream sequence, until folded
	folded  uint64                  // the memory stream's sequence folded into the store
}

type reservation struct {
	ns    string
	bytes int64
	done  bool
}

func newReservations() *reservations {
	return &reservations{pending: map[string]int64{}, bySeq: map[uint64]*reservation{}}
}

// reserve runs check with the bytes reserved for ns and, when it passes,
// reserves the bytes it reports the write adds (nothing for a write that
// does not grow the namespace: its reservation is nil).
func (r *reservations) reserve(ns string, check func(reserved int64) (grow int64, err error)) (*reservation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	grow, err := check(r.pending[ns])
	if err != nil || grow <= 0 {
		return nil, err
	}
	r.pending[ns] += grow
	return &reservation{ns: ns, bytes: grow}, nil
}

// published keeps res until the write at seq is folded (at once when it
// already is).
func (r *reservations) published(res *reservation, seq uint64) {
	if res == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq <= r.folded {
		r.releaseLocked(res)
		return
	}
	if old := r.bySeq[seq]; old != nil {
		r.releaseLocked(old) // two answers for one sequence (a retried write): one is enough
	}
	r.bySeq[seq] = res
}

// release ends res (its write was not published).
func (r *reservations) release(res *reservation) {
	if res == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseLocked(res)
}

func (r *reservations) releaseLocked(res *reservation) {
	if res.done {
		return
	}
	res.done = true
	if r.pending[res.ns] -= res.bytes; r.pending[res.ns] <= 0 {
		delete(r.pending, res.ns)
	}
}

// fold ends the reservations of the writes up to last, which the store now
// holds.
func (r *reservations) fold(last uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.folded = max(r.folded, last)
	for seq, res := range r.bySeq {
		if seq <= last {
			r.releaseLocked(res)
			delete(r.bySeq, seq)
		}
	}
}

// reset starts counting the folded writes again from none: the replica folds
// the memory stream again from its start. Reservations of published writes
// end as the new fold passes their sequences.
func (r *reservations) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.folded = 0
}
