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
	last atomic.Int64 // when a JavaScript job last came (unix ns)
}

// Saw notes job, so that the sandboxes started next expect more JavaScript.
func (e *JSExpectation) Saw(job Job) {
	if job.Language == JavaScript {
		e.last.Store(time.Now().UnixNano())
	}
}

// Expected reports whether a sandbox started now should keep a JavaScript
// executor ready (the runner's --spare-javascript).
func (e *JSExpectation) Expected() bool {
	last := e.last.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < JSWarmFor
}
