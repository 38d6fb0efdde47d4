package mcpclients

import (
	"reflect"

	"github.com/mcpexec/mcpexec/internal/discovery"
)

// Update replaces the pool's servers with servers (a new discovery): new ones
// are added, changed ones restart with their new definition on next use,
// and removed ones are closed. It returns the names of each.
func (p *Pool) Update(servers []discovery.Server) (added, changed, removed []string) {
	p.mu.Lock()
	next := map[string]*slot{}
	var order []string
	var drop []*slot
	for _, def := range servers {
		if _, dup := next[def.Name]; dup {
			continue
		}
		order = append(order, def.Name)
		old, ok := p.servers[def.Name]
		switch {
		case !ok:
			added = append(added, def.Name)
			next[def.Name] = &slot{def: def, pool: p}
		case !sameDefinition(old.def, def):
			changed = append(changed, def.Name)
			drop = append(drop, old)
			next[def.Name] = &slot{def: def, pool: p}
		default:
			next[def.Name] = old
		}
	}
	for _, n := range p.order {
		if _, ok := next[n]; !ok {
			removed = append(removed, n)
			drop = append(drop, p.servers[n])
		}
	}
	p.order, p.servers = order, next
	p.mu.Unlock()
	for _, sl := range drop {
		sl.retire() // no new calls; its session closes in the background
	}
	return added, changed, removed
}

// sameDefinition reports whether a and b launch or reach the same server the
// same way (where they were read from aside).
func sameDefinition(a, b discovery.Server) bool {
	a.Source, b.Source = "", ""
	return reflect.DeepEqual(a, b)
}
