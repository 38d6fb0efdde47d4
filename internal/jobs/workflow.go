package jobs

import (
	"fmt"
	"strings"
)

// Order returns the indexes of one submission's jobs with every job after
// the parents it names within it (the order their submissions must reach
// the events stream), or an *InvalidError naming a cycle. Parents outside js
// are not looked at.
func Order(js []*Job) ([]int, error) {
	byID := make(map[string]int, len(js))
	for i, j := range js {
		byID[j.ID] = i
	}
	const (
		unseen = iota
		visiting
		done
	)
	mark := make([]int, len(js))
	out := make([]int, 0, len(js))
	// Iterative depth-first search: a chain of 10,000 jobs must not blow the stack.
	type frame struct {
		i       int
		parents []string
	}
	for start := range js {
		if mark[start] != unseen {
			continue
		}
		stack := []frame{{start, js[start].Parents()}}
		mark[start] = visiting
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if len(top.parents) == 0 {
				mark[top.i] = done
				out = append(out, top.i)
				stack = stack[:len(stack)-1]
				continue
			}
			p := top.parents[0]
			top.parents = top.parents[1:]
			k, ok := byID[p]
			if !ok || mark[k] == done {
				continue
			}
			if mark[k] == visiting {
				var cycle []string
				for f := len(stack) - 1; f >= 0; f-- {
					cycle = append(cycle, js[stack[f].i].name())
					if stack[f].i == k {
						break
					}
				}
				return nil, invalid("after", "the jobs wait for each other in a cycle: %s → %s: remove one of these edges", strings.Join(reverse(cycle), " → "), js[k].name())
			}
			mark[k] = visiting
			stack = append(stack, frame{k, js[k].Parents()})
		}
	}
	return out, nil
}

func reverse(s []string) []string {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}

// Readiness says what a waiting job's parents allow.
type Readiness int

// A waiting job is not ready, runs, or is skipped.
const (
	NotReady Readiness = iota
	Ready
	Skip
)

// Ready decides a waiting job's fate from its parents' records (keyed by
// id; a missing one has not been recorded yet). It returns Skip with the
// reason when a parent in After ended other than success.
func (j *Job) Ready(parents map[string]*Record) (Readiness, string) {
	ready := Ready
	for _, p := range j.After {
		r := parents[p]
		switch {
		case r == nil || !r.Status.Terminal():
			ready = NotReady
		case r.Status != StatusSuccess:
			name, ok := UnscopedID(j.Namespace, p)
			if !ok {
				name = p
			}
			return Skip, fmt.Sprintf("parent %s ended %s", name, r.Status)
		}
	}
	for _, p := range j.AfterAny {
		if r := parents[p]; r == nil || !r.Status.Terminal() {
			ready = NotReady
		}
	}
	return ready, ""
}

// name is the job's id as its namespace knows it.
func (j *Job) name() string {
	if id, ok := UnscopedID(j.Namespace, j.ID); ok && j.Namespace != "" {
		return id
	}
	return j.ID
}
