// Package slots bounds concurrent use per key: how many event streams one
// namespace holds open on a front-end, how many long requests one token has
// in flight. A shared cap alone lets one tenant take every slot; a cap per
// key leaves the others theirs.
package slots

import "sync"

// Keyed hands out at most Max slots per key (and, when Total is set, at most
// Total in all). The zero value takes nothing: set Max.
type Keyed struct {
	Max   int // per key
	Total int // in all; 0: no overall bound

	mu  sync.Mutex
	n   map[string]int
	sum int
}

// Take takes a slot of key and reports whether it got one; a taken slot is
// given back with the returned release, once.
func (k *Keyed) Take(key string) (release func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.n[key] >= k.Max || (k.Total > 0 && k.sum >= k.Total) {
		return func() {}, false
	}
	if k.n == nil {
		k.n = map[string]int{}
	}
	k.n[key]++
	k.sum++
	var once sync.Once
	return func() { once.Do(func() { k.give(key) }) }, true
}

func (k *Keyed) give(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.n[key]--; k.n[key] <= 0 {
		delete(k.n, key) // the map holds only keys in use
	}
	k.sum--
}

// InUse returns the slots key holds, and all keys together.
func (k *Keyed) InUse(key string) (mine, all int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[key], k.sum
}
