package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stalled is a replicated stream that no replica will lead, and the files
// on this node its repair removes.
type stalled struct {
	Name    string
	Account string   // its account
	Group   string   // its Raft group
	Peers   []string // the other nodes holding a replica
	Files   []string // its store, and the Raft logs of it and its consumers
}

// stalledStreams names the replicated streams this node holds that have no
// leader although every node of the cluster is connected to it. That is not
// a cluster still forming or a node away: after a power cut of every node,
// nats-server 2.15 can find each replica of a work-queue stream behind the
// stream's last Raft snapshot (messages the snapshot lists were acknowledged
// and removed since, and the removal outlived the cut). Each replica then
// waits to catch up from a leader, none campaigns while it waits, and the
// stream stays without one (docs/design.md, "A stream no replica will lead").
// It returns nil while a node is missing or nothing is known.
func (b *Broker) stalledStreams() []stalled {
	if !b.connectedToAll() {
		return nil
	}
	return b.leaderlessHere()
}

// connectedToAll reports whether this node, of a cluster, has a route to
// every other node.
func (b *Broker) connectedToAll() bool {
	if !b.cfg.Cluster.Enabled() {
		return false
	}
	rz, err := b.ns.Routez(nil)
	if err != nil {
		return false
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteID] = true
	}
	return len(peers) >= b.cfg.Cluster.Size()-1
}

// leaderlessHere lists the replicated streams of this node whose Raft group
// knows no leader, with their files.
func (b *Broker) leaderlessHere() []stalled {
	jsz, err := b.ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true, RaftGroups: true})
	if err != nil {
		return nil
	}
	return leaderless(jsz, b.ns.StoreDir())
}

// leaderless lists the streams of info whose Raft group knows no leader,
// with their files under root (a node's JetStream directory).
func leaderless(info *server.JSInfo, root string) []stalled {
	var out []stalled
	for _, acc := range info.AccountDetails {
		for _, st := range acc.Streams {
			if st.Cluster == nil || st.Cluster.Leader != "" || len(st.Cluster.Replicas) == 0 {
				continue
			}
			s := stalled{Name: st.Name, Account: acc.Name, Group: st.RaftGroup, Files: []string{filepath.Join(root, acc.Name, "streams", st.Name)}}
			for _, p := range st.Cluster.Replicas {
				s.Peers = append(s.Peers, p.Name)
			}
			if st.RaftGroup != "" {
				s.Files = append(s.Files, filepath.Join(root, server.DEFAULT_SYSTEM_ACCOUNT, "_js_", st.RaftGroup))
			}
			for _, c := range st.ConsumerRaftGroups {
				s.Files = append(s.Files, filepath.Join(root, server.DEFAULT_SYSTEM_ACCOUNT, "_js_", c.RaftGroup))
			}
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b stalled) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// warnStalled warns, after waiting long in setup step what, if streams have
// no replica that will lead them.
func (b *Broker) warnStalled(what string, waiting time.Duration, err error) {
	if stalled := b.stalledStreams(); len(stalled) > 0 {
		b.cfg.Logger.Warn("streams have no leader although every node is up", "streams", len(stalled),
			"waiting", waiting.Round(time.Second), "why", stalledError(what, b.cfg.Cluster.Name, stalled, err).Error())
	}
}

// stalledError says what the operator of a node whose streams stay
// leaderless can do.
func stalledError(what, cluster string, streams []stalled, err error) error {
	names := make([]string, len(streams))
	var files []string
	for i, s := range streams {
		names[i] = s.Name
		files = append(files, s.Files...)
	}
	return fmt.Errorf("%s: the cluster %q is up, but stream %s has no leader (%w): each replica waits to catch up "+
		"from a leader none of them will become, as nats-server does when every replica is behind the stream's last "+
		"snapshot (seen after a power cut of every node); restarting does not help, nor does deleting the stream "+
		"(the request times out). The brokers replace the jobs stream themselves once each of its replicas has "+
		"waited --stall-repair (default %s) with every node up, and queue its jobs again; that was not done here "+
		"(--stall-repair -1, a start that ended first, a stream stalled again after it was replaced, or another "+
		"stream). To repair by hand: stop every broker, remove on every node the stream's files (on this "+
		"node: %s), and start them again: the cluster creates the stream and its consumers again, empty. Jobs a "+
		"jobs stream held stay recorded queued until --queued-max-age records them rejected; submit them again under "+
		"new ids (docs/design.md, \"A stream no replica will lead\")", what, cluster, strings.Join(names, ", "), err,
		DefaultStallRepair, strings.Join(files, " "))
}

// DefaultStallRepair is how long the jobs stream may stay without a leader,
// with every node connected, before the brokers replace it.
const DefaultStallRepair = 20 * time.Second

// stallReportEvery bounds how often a waiting node tells the others that its
// jobs stream is stalled; a report older than stallReportFresh is not
// counted.
const (
	stallReportEvery = time.Second
	stallReportFresh = 15 * time.Second
)

// stallRepair is the error that ends a start whose jobs stream every replica
// found stalled for StallRepair: Start then sets this node's copy aside and
// starts again.
type stallRepair struct {
	stream string
	files  []string
	after  time.Duration
}

func (e *stallRepair) Error() string {
	return fmt.Sprintf("stream %s has had no leader for %s on every node: replacing it", e.stream, e.after.Round(time.Second))
}

// stallReport is what a node whose jobs stream is stalled tells the others:
// for how long, and, last, that it is replacing its copy.
type stallReport struct {
	Node      string        `json:"node"`
	Group     string        `json:"group"`
	Stream    string        `json:"stream"`
	For       time.Duration `json:"stalled_for"`
	Replacing bool          `json:"replacing,omitempty"`
}

// stallWatch follows, while stream setup waits, whether this node's jobs
// stream stays stalled (its replica paused, waiting to catch up, and no
// leader, with every node connected) and what the other replicas report.
// The replicas replace the stream only together: one replaced alone would come back
// empty beside replicas that still wait, and be refused as their leader.
// So a replica replaces its copy once every replica of the stream has said,
// within stallReportFresh, that it has waited StallRepair, or once one of
// them has said it is replacing its copy (its routes are then down while it
// restarts, so "every node connected" no longer holds for the others).
type stallWatch struct {
	b     *Broker
	sub   *nats.Subscription
	after time.Duration

	since    time.Time // when the stall was first seen, zero while not stalled
	reported time.Time
	seen     *stalled // the stall last seen, if ever in this start

	mu      sync.Mutex
	reports map[string]heard // node -> its last report
}

type heard struct {
	stallReport
	at time.Time
}

// watchStall starts watching, or returns nil where no repair is made: a
// single node, repair turned off, or a stream this start replaced already.
func (b *Broker) watchStall() (*stallWatch, error) {
	after := b.cfg.StallRepair
	if after == 0 {
		after = DefaultStallRepair
	}
	if !b.cfg.Cluster.Enabled() || after < 0 || b.repaired {
		return nil, nil
	}
	w := &stallWatch{b: b, after: after, reports: map[string]heard{}}
	sub, err := b.nc.Subscribe(b.cfg.Queue.Subjects.BrokerStalled(), w.hear)
	if err != nil {
		return nil, fmt.Errorf("listen for the other nodes' stall reports: %w", err)
	}
	w.sub = sub
	return w, nil
}

// hear keeps a report of a node (this one's own too). Only brokers may
// publish on the subject; even so it is checked as received: bounded,
// decodable, named, and kept per node, one each, for at most 16 nodes. The
// checks count only reports of this node's stream's Raft group, from its
// peers.
func (w *stallWatch) hear(m *nats.Msg) {
	if len(m.Data) > 4096 {
		return
	}
	var r stallReport
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Node == "" || r.Group == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.reports[r.Node]; !ok && len(w.reports) >= 16 {
		return
	}
	if old, ok := w.reports[r.Node]; ok && old.Replacing {
		return // a node's decision stands for this start
	}
	w.reports[r.Node] = heard{r, time.Now()}
}

func (w *stallWatch) stop() {
	if w != nil {
		_ = w.sub.Unsubscribe() // the connection may be closing; the watch ends either way
	}
}

// check looks at this node's jobs stream once stream setup has failed: it
// returns a *stallRepair when this node is to replace its copy, and nil
// otherwise.
func (w *stallWatch) check() error {
	if w == nil {
		return nil
	}
	jobsStream := w.b.cfg.Queue.Subjects.JobsStream()
	var st *stalled
	for _, s := range w.b.leaderlessHere() {
		if s.Name == jobsStream && s.Group != "" {
			st = &s
		}
	}
	if st == nil {
		w.since = time.Time{}
		return nil
	}
	// The clock starts when the replica is seen paused without a leader;
	// it goes on while the stream has no leader, since a paused replica
	// replays its snapshot every 5 s and shows unpaused for a moment.
	if w.since.IsZero() && !w.b.pausedWithoutLeader(st.Account, st.Group) {
		return nil
	}
	now := time.Now()
	if !w.since.IsZero() && w.peerReplacing(st.Group) {
		return w.replace(st, now)
	}
	if !w.b.connectedToAll() {
		return nil // a cluster forming, or a node away: not a stall
	}
	if w.since.IsZero() {
		w.since = now
	}
	w.seen = st
	me := stallReport{Node: w.b.ns.Name(), Group: st.Group, Stream: st.Name, For: now.Sub(w.since)}
	if now.Sub(w.reported) >= stallReportEvery {
		w.report(me)
		w.reported = now
	}
	if me.For < w.after || !w.peersWaited(st, now) {
		return nil
	}
	return w.replace(st, now)
}

// afterReady is called once stream setup has succeeded: a node that saw
// its jobs stream stalled and heard another replica replace its copy
// replaces its own too, even if the replaced replicas have meanwhile
// elected a leader (setup then succeeds here): its copy still holds the
// old stream's term and snapshot, which the new stream's replicas know
// nothing of.
func (w *stallWatch) afterReady() error {
	if w == nil || w.seen == nil || !w.peerReplacing(w.seen.Group) {
		return nil
	}
	return w.replace(w.seen, time.Now())
}

// replace tells the other replicas that this node replaces its copy of st,
// and returns the error that makes Start do it.
func (w *stallWatch) replace(st *stalled, now time.Time) error {
	if w.since.IsZero() {
		w.since = now
	}
	w.report(stallReport{Node: w.b.ns.Name(), Group: st.Group, Stream: st.Name, For: now.Sub(w.since), Replacing: true})
	_ = w.b.nc.Flush() // best effort: a replica that missed it decides on its own reports
	return &stallRepair{stream: st.Name, files: st.Files, after: now.Sub(w.since)}
}

func (w *stallWatch) report(r stallReport) {
	if data, err := json.Marshal(r); err == nil {
		_ = w.b.nc.Publish(w.b.cfg.Queue.Subjects.BrokerStalled(), data) // the next check reports again
	}
}

// peersWaited reports whether every other replica of st has said, lately,
// that it has waited the repair delay.
func (w *stallWatch) peersWaited(st *stalled, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range st.Peers {
		r, ok := w.reports[p]
		if !ok || r.Group != st.Group || now.Sub(r.at) > stallReportFresh || r.For < w.after {
			return false
		}
	}
	return true
}

// peerReplacing reports whether another replica said it replaces its copy
// of the stream of Raft group group.
func (w *stallWatch) peerReplacing(group string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.reports {
		if r.Replacing && r.Group == group {
			return true
		}
	}
	return false
}

// pausedWithoutLeader reports whether this node's replica of Raft group
// group (of a stream of account) has paused applying (it waits to catch up
// from a leader) while the group knows no leader: a paused replica does not
// campaign, so when every replica is in this state none ever will. A
// replica paused while a leader exists, or one not paused, is not.
func (b *Broker) pausedWithoutLeader(account, group string) bool {
	rz := b.ns.Raftz(&server.RaftzOptions{AccountFilter: account, GroupFilter: group})
	if rz == nil {
		return false
	}
	for _, groups := range *rz {
		if g, ok := groups[group]; ok {
			return g.Paused && g.Leader == ""
		}
	}
	return false
}

// setAside moves files (under root, the JetStream directory, so that a
// rename stays on its file system) into a directory of their own under
// root, keeping their paths below it, and returns that directory: kept for
// the operator to inspect and remove.
func setAside(root string, files []string) (string, error) {
	aside := filepath.Join(root, fmt.Sprintf("stalled-%d", time.Now().Unix()))
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil || strings.HasPrefix(rel, "..") {
			return "", fmt.Errorf("%s is not under the JetStream directory %s", f, root)
		}
		dst := filepath.Join(aside, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return "", fmt.Errorf("set %s aside: %w", f, err)
		}
		if err := os.Rename(f, dst); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("set %s aside: %w", f, err)
		}
	}
	return aside, nil
}

// keepAside is how long a copy setAside made is kept: evidence for the
// operator, but not for ever (each is a whole jobs stream). The newest copy
// is kept whatever its age.
const keepAside = 7 * 24 * time.Hour

// pruneAside removes the copies setAside made under root (stalled-<unix>)
// that are older than keepAside at now, except the newest, and returns
// those it removed. A name that is not such a copy is left alone.
func pruneAside(root string, now time.Time) ([]string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	type copyAside struct {
		path string
		at   time.Time
	}
	var copies []copyAside
	for _, e := range entries {
		unix, ok := strings.CutPrefix(e.Name(), "stalled-")
		sec, err := strconv.ParseInt(unix, 10, 64)
		if !ok || err != nil || !e.IsDir() {
			continue
		}
		copies = append(copies, copyAside{filepath.Join(root, e.Name()), time.Unix(sec, 0)})
	}
	slices.SortFunc(copies, func(a, b copyAside) int { return b.at.Compare(a.at) })
	var removed []string
	var errs []error
	for i, c := range copies {
		if i == 0 || now.Sub(c.at) <= keepAside {
			continue
		}
		if err := os.RemoveAll(c.path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, c.path)
	}
	return removed, errors.Join(errs...)
}

// resetStaleConsumers deletes, and creates again with the same
// configuration, each consumer of the jobs stream that has delivered past
// the replaced stream's last sequence. The replicas replace their copies a
// few seconds apart, so a consumer's Raft group can keep the old stream's
// state (a leader on a node not yet replaced catches the replaced ones up
// with it): such a consumer counts as delivered every new message up to
// the old stream's last sequence, and its workers would never get the
// requeued jobs or new ones. A consumer made again starts at the new
// stream's first message. Every replaced node calls it before requeueing;
// a consumer another node made again is not stale, so it is reset once.
func (b *Broker) resetStaleConsumers(ctx context.Context) error {
	js, err := jetstream.New(b.nc)
	if err != nil {
		return err
	}
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		done, err := b.resetStaleOnce(ctx, js)
		if done || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// resetStaleOnce makes the stale consumers again; done is false when the
// stream or a consumer could not be read or made (try again).
func (b *Broker) resetStaleOnce(ctx context.Context, js jetstream.JetStream) (done bool, err error) {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := js.Stream(actx, b.cfg.Queue.Subjects.JobsStream())
	if err != nil {
		return false, err
	}
	last := st.CachedInfo().State.LastSeq
	lister := st.ListConsumers(actx)
	var stale []*jetstream.ConsumerInfo
	for ci := range lister.Info() {
		if ci.Delivered.Stream > last || ci.AckFloor.Stream > last {
			stale = append(stale, ci)
		}
	}
	if err := lister.Err(); err != nil {
		return false, err
	}
	for _, ci := range stale {
		if err := st.DeleteConsumer(actx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return false, fmt.Errorf("delete stale consumer %s: %w", ci.Name, err)
		}
		if _, err := st.CreateOrUpdateConsumer(actx, ci.Config); err != nil {
			return false, fmt.Errorf("create consumer %s again: %w", ci.Name, err)
		}
		b.cfg.Logger.Warn("consumer of the replaced jobs stream kept the old stream's position: made again", "consumer", ci.Name,
			"delivered", ci.Delivered.Stream, "stream_last", last)
	}
	return true, nil
}
