package sandbox

import (
	"sync/atomic"
	"time"
)

// JSWarmFor is how long after a JavaScript job a runtime's new sandboxes
// keep a JavaScript executor started ahead (Node takes ~70 ms to start; a
// worker that runs Python only never pays for it).
const JSWarmFor = 30 * time.Minute

// JSExpectation is a runtime's memory of its last JavaScript job. Safe for
// concurrent use; the zero value expects none.
type JSExpectation struct {
	last lately // when a JavaScript job last came
}

// Saw notes job, so that the sandboxes started next expect more JavaScript.
func (e *JSExpectation) Saw(job Job) {
	if job.Language == JavaScript {
		e.last.saw()
	}
}

// Expected reports whether a sandbox started now should keep a JavaScript
// executor ready (the runner's --spare-javascript).
func (e *JSExpectation) Expected() bool { return e.last.within(JSWarmFor) }

// lately is when something last happened (the zero value: never). Safe for
// concurrent use.
type lately struct {
	last atomic.Int64 // unix ns
}

func (l *lately) saw() { l.last.Store(time.Now().UnixNano()) }

// within reports whether it happened less than d ago.
func (l *lately) within(d time.Duration) bool {
	last := l.last.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < d
}
