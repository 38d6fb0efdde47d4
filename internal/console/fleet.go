package console

import (
	"net/http"
	"sort"
	"time"

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

// FrontendView is this front-end.
type FrontendView struct {
	ID             string   `json:"id"`
	Servers        []string `json:"servers"`
	CallsPerMinute float64  `json:"calls_per_minute"`
}

// Fleet is the answer of GET /api/console/fleet.
type Fleet struct {
	At        time.Time      `json:"at"`
	Workers   []WorkerView   `json:"workers"`
	Frontends []FrontendView `json:"frontends"`
	Error     string         `json:"error,omitempty"` // why the workers could not be asked
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
	fv := FrontendView{ID: a.cfg.FrontendID, Servers: a.cfg.Servers()}
	if fv.Servers == nil {
		fv.Servers = []string{}
	}
	if a.cfg.History != nil {
		fv.CallsPerMinute = a.cfg.History.CallsPerMinute()
	}
	f.Frontends = []FrontendView{fv}
	writeJSON(w, http.StatusOK, f)
}
