package broker

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// stalled is a replicated stream that no replica will lead, and the files
// on this node its repair removes.
type stalled struct {
	Name  string
	Files []string // its store, and the Raft logs of it and its consumers
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
	if !b.cfg.Cluster.Enabled() {
		return nil
	}
	rz, err := b.ns.Routez(nil)
	if err != nil {
		return nil
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteID] = true
	}
	if len(peers) < b.cfg.Cluster.Size()-1 {
		return nil
	}
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
			s := stalled{Name: st.Name, Files: []string{filepath.Join(root, acc.Name, "streams", st.Name)}}
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
		"(the request times out). To repair: stop every broker, remove on every node the stream's files (on this "+
		"node: %s), and start them again: the cluster creates the stream and its consumers again, empty. Jobs it "+
		"held stay recorded queued until --queued-max-age records them rejected; submit them again under new ids "+
		"(docs/design.md, \"A stream no replica will lead\")", what, cluster, strings.Join(names, ", "), err, strings.Join(files, " "))
}
