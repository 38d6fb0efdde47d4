package broker

import "github.com/nats-io/nats-server/v2/server"

// StalledStreams exposes stalledStreams to the external tests.
func (b *Broker) StalledStreams() []string { return b.stalledStreams() }

// Leaderless exposes leaderless to the external tests.
func Leaderless(info *server.JSInfo) []string { return leaderless(info) }

// LeaderlessHere names the streams this node's server sees without a leader,
// whether or not every node is connected.
func (b *Broker) LeaderlessHere() []string {
	jsz, err := b.ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return nil
	}
	return leaderless(jsz)
}
