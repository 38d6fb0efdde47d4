package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them. Two of
// nats-server's are let go: a clustered node's shutdown can race a stream
// store being created (a raft apply on a replica under kill), and that
// store's flush loop and its access-time ticker (one per store) are then
// never stopped. The store is the library's; every broker these tests start
// is closed and waited for (broker.Close waits for the server's shutdown).
// Seen once in CI after TestWorkflowSurvivesFaults, which kills a node.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}
