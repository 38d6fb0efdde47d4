package console

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// workerSeen is the last answer of a worker and when it came.
type workerSeen struct {
	status jobs.WorkerStatus
	at     time.Time
}

// WorkerView is a worker as the fleet page shows it: its last answer, when
// that came, and whether it is stale (no answer for StaleAfter).
type WorkerView struct {
	jobs.WorkerStatus
	LastSeen time.Time `json:"last_seen"`
	Stale    bool      `json:"stale"`
}

// FrontendView is a front-end as the fleet page shows it: its last answer,
// when that came, whether it is stale, and whether it is the one serving
// this console.
type FrontendView struct {
	jobs.FrontendStatus
	LastSeen time.Time `json:"last_seen"`
	Stale    bool      `json:"stale"`
	This     bool      `json:"this"`
}

// BrokerView is a broker node as the streams' replicas show it.
type BrokerView struct {
	Name    string   `json:"name"`
	Leads   []string `json:"leads"`   // streams it leads
	Follows []string `json:"follows"` // streams it follows, with the lag
	Behind  bool     `json:"behind"`  // a replica of it is not current or offline
}

// Fleet is the answer of GET /api/console/fleet.
type Fleet struct {
	At        time.Time               `json:"at"`
	Cluster   string                  `json:"cluster,omitempty"`
	Brokers   []BrokerView            `json:"brokers"`
	Streams   []frontend.StreamStatus `json:"streams"`
	Workers   []WorkerView            `json:"workers"`
	Frontends []FrontendView          `json:"frontends"`
	Error     string                  `json:"error,omitempty"` // why the workers could not be asked
	// CountsHidden: the caller is a tenant, not an admin, and sees no count
	// that moves with other namespaces' work (stream sizes, busy slots,
	// sessions, warm containers, load, proxy calls): zero here.
	CountsHidden bool `json:"counts_hidden,omitempty"`
}

// hideCounts zeroes what a tenant may not see of the fleet: every count
// that another namespace's jobs move.
func (f *Fleet) hideCounts() {
	f.CountsHidden = true
	for i := range f.Streams {
		f.Streams[i].Messages, f.Streams[i].Bytes = 0, 0
		for j := range f.Streams[i].Replicas {
			f.Streams[i].Replicas[j].Lag = 0
		}
	}
	for i := range f.Workers {
		w := &f.Workers[i]
		w.Running, w.Warm, w.Sessions, w.Load1, w.Started, w.StartFailures = 0, 0, 0, 0, 0, 0
	}
	for i := range f.Frontends {
		f.Frontends[i].CallsPerMinute, f.Frontends[i].Running = 0, 0
	}
}

// maxSeenWorkers bounds the workers remembered as stale.
const maxSeenWorkers = 1024

func (a *api) fleet(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	f := Fleet{At: now, Workers: []WorkerView{}}
	ws, err := a.cfg.Backend.Workers(r.Context())
	if err != nil {
		f.Error = err.Error()
	}
	a.mu.Lock()
	for _, s := range ws {
		a.seen[s.ID] = workerSeen{status: s, at: now}
	}
	for id, s := range a.seen {
		if now.Sub(s.at) > time.Hour || len(a.seen) > maxSeenWorkers {
			delete(a.seen, id) // gone for good
			continue
		}
		f.Workers = append(f.Workers, WorkerView{WorkerStatus: s.status, LastSeen: s.at, Stale: now.Sub(s.at) > a.cfg.StaleAfter})
	}
	a.mu.Unlock()
	sort.Slice(f.Workers, func(i, j int) bool { return f.Workers[i].ID < f.Workers[j].ID })
	f.Frontends = a.frontends(r, now)
	server, cluster := a.cfg.Backend.Broker()
	f.Cluster = cluster
	f.Streams = a.cfg.Backend.Streams(r.Context())
	f.Brokers = brokers(server, f.Streams)
	if !a.cfg.IsAdmin(r.Context()) {
		f.hideCounts()
	}
	httperr.WriteJSON(w, http.StatusOK, f)
}

// frontends asks every front-end of the fleet for its status and adds
// those that answered before (stale, for an hour); this one always shows,
// from its own status when its answer did not come.
func (a *api) frontends(r *http.Request, now time.Time) []FrontendView {
	fs, _ := a.cfg.Backend.Frontends(r.Context()) // none answering: this one, from its own status, below
	self := false
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range fs {
		a.seenFrontends[s.ID] = frontendSeen{status: s, at: now}
		self = self || s.ID == a.cfg.FrontendID
	}
	if !self {
		st := a.cfg.Backend.Status()
		a.seenFrontends[st.ID] = frontendSeen{status: st, at: now}
	}
	out := []FrontendView{}
	for id, s := range a.seenFrontends {
		if now.Sub(s.at) > time.Hour || len(a.seenFrontends) > maxSeenWorkers {
			delete(a.seenFrontends, id) // gone for good
			continue
		}
		out = append(out, FrontendView{FrontendStatus: s.status, LastSeen: s.at, Stale: now.Sub(s.at) > a.cfg.StaleAfter, This: id == a.cfg.FrontendID})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// frontendSeen is the last answer of a front-end and when it came.
type frontendSeen struct {
	status jobs.FrontendStatus
	at     time.Time
}

// brokers gathers the broker nodes from the streams' leaders and replicas
// (one node, server, when the streams are not clustered).
func brokers(server string, streams []frontend.StreamStatus) []BrokerView {
	byName := map[string]*BrokerView{}
	node := func(name string) *BrokerView {
		if byName[name] == nil {
			byName[name] = &BrokerView{Name: name, Leads: []string{}, Follows: []string{}}
		}
		return byName[name]
	}
	for _, st := range streams {
		if st.Leader == "" {
			continue
		}
		node(st.Leader).Leads = append(node(st.Leader).Leads, st.Name)
		for _, r := range st.Replicas {
			b := node(r.Name)
			b.Follows = append(b.Follows, fmt.Sprintf("%s (lag %d)", st.Name, r.Lag))
			b.Behind = b.Behind || !r.Current || r.Offline
		}
	}
	if len(byName) == 0 && server != "" {
		b := node(server)
		for _, st := range streams {
			if st.Error == "" {
				b.Leads = append(b.Leads, st.Name)
			}
		}
	}
	out := make([]BrokerView, 0, len(byName))
	for _, b := range byName {
		out = append(out, *b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
