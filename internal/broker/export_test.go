package broker

import "github.com/nats-io/nats-server/v2/server"

// Stalled is a stream no replica will lead, and its files here.
type Stalled = stalled

// StalledStreams exposes stalledStreams to the external tests.
func (b *Broker) StalledStreams() []Stalled { return b.stalledStreams() }

// Leaderless exposes leaderless to the external tests.
func Leaderless(info *server.JSInfo, root string) []Stalled { return leaderless(info, root) }

// LeaderlessHere names the streams this node's server sees without a leader,
// whether or not every node is connected.
func (b *Broker) LeaderlessHere() []string {
	var names []string
	for _, s := range b.leaderlessHere() {
		names = append(names, s.Name)
	}
	return names
}
