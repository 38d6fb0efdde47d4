package queue_test

import (
	"fmt"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// The queue's settings start from DefaultConfig; Validate says what is wrong
// with a change before any stream is made.
func ExampleConfig_Validate() {
	cfg := queue.DefaultConfig()
	fmt.Println(cfg.Validate())
	cfg.MaxDeliver = 0
	fmt.Println(cfg.Validate() != nil)
	// Output:
	// <nil>
	// true
}

// Every event has one message id per job, kind and attempt: a republished
// event is deduplicated by the events stream.
func ExampleEventMsgID() {
	fmt.Println(queue.EventMsgID(jobs.Event{Job: "j1", Kind: jobs.EventStarted, Attempt: 2}))
	// Output: j1.started.2
}
