package broker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// stalledStreams names the replicated streams this node holds that have no
// leader although every node of the cluster is connected to it. That is not
// a cluster still forming or a node away: after a power cut of every node,
// nats-server 2.15 can find each replica of a work-queue stream behind the
// stream's last Raft snapshot (messages the snapshot lists were acknowledged
// and removed since, and the removal outlived the cut). Each replica then
// waits to catch up from a leader, none campaigns while it waits, and the
// stream stays without one (docs/design.md, "A stream no replica will lead").
// It returns nil while a node is missing or nothing is known.
func (b *Broker) stalledStreams() []string {
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
	jsz, err := b.ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return nil
	}
	return leaderless(jsz)
}

// leaderless names the streams of info whose Raft group knows no leader.
func leaderless(info *server.JSInfo) []string {
	var names []string
	for _, acc := range info.AccountDetails {
		for _, st := range acc.Streams {
			if st.Cluster != nil && st.Cluster.Leader == "" && len(st.Cluster.Replicas) > 0 {
				names = append(names, st.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// stalledError says what the operator of a node whose streams stay
// leaderless can do.
func stalledError(what, cluster string, streams []string, err error) error {
	return fmt.Errorf("%s: the cluster %q is up, but stream %s has no leader (%w): each replica waits to catch up "+
		"from a leader none of them will become, as nats-server does when every replica is behind the stream's last "+
		"snapshot (seen after a power cut of every node); restarting does not help. To repair, delete the stream "+
		"(nats stream rm, with the cluster's admin credentials) and restart the brokers, which create it again; "+
		"jobs it held stay recorded queued until --queued-max-age records them rejected, so submit them again "+
		"under new ids (docs/design.md, \"A stream no replica will lead\")", what, cluster, strings.Join(streams, ", "), err)
}
