package frontend

import (
	"context"
	"time"
)

// StreamStatus is one of the fleet's streams as the console's fleet page
// shows it: size, and where its replicas are (the brokers' roles).
type StreamStatus struct {
	Name     string          `json:"name"`
	Messages uint64          `json:"messages"`
	Bytes    uint64          `json:"bytes"`
	Cluster  string          `json:"cluster,omitempty"`
	Leader   string          `json:"leader,omitempty"`
	Replicas []ReplicaStatus `json:"replicas,omitempty"` // the followers
	Error    string          `json:"error,omitempty"`    // why it could not be read
}

// ReplicaStatus is a follower of a stream.
type ReplicaStatus struct {
	Name     string `json:"name"`
	Current  bool   `json:"current"`
	Offline  bool   `json:"offline,omitempty"`
	Lag      uint64 `json:"lag"`       // operations behind the leader
	ActiveMS int64  `json:"active_ms"` // since it was last heard from
}

// Streams reads the jobs, events and memory streams' state (the caller's
// ctx bounds it).
func (f *Frontend) Streams(ctx context.Context) []StreamStatus {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s := f.cfg.Subjects
	var out []StreamStatus
	for _, name := range []string{s.JobsStream(), s.EventsStream(), s.MemoryStream()} {
		st := StreamStatus{Name: name}
		info, err := f.client.JetStream().Stream(ctx, name)
		if err == nil {
			i := info.CachedInfo()
			st.Messages, st.Bytes = i.State.Msgs, i.State.Bytes
			if c := i.Cluster; c != nil {
				st.Cluster, st.Leader = c.Name, c.Leader
				for _, r := range c.Replicas {
					st.Replicas = append(st.Replicas, ReplicaStatus{Name: r.Name, Current: r.Current, Offline: r.Offline, Lag: r.Lag, ActiveMS: r.Active.Milliseconds()})
				}
			}
		} else {
			st.Error = err.Error()
		}
		out = append(out, st)
	}
	return out
}

// Broker names the broker this front-end is connected to, and its cluster
// ("" when it is not clustered).
func (f *Frontend) Broker() (server, cluster string) {
	return f.nc.ConnectedServerName(), f.nc.ConnectedClusterName()
}
