// Package natstest starts in-process nats-servers for tests of packages
// below testutil (which imports the worker and the front-end, and so cannot
// serve the packages they import).
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server starts a nats-server on a free loopback port, with JetStream in
// a temporary directory when jetStream is set; it is shut down when the
// test ends.
func Server(t testing.TB, jetStream bool) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true}
	if jetStream {
		opts.JetStream, opts.StoreDir = true, t.TempDir()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start within 10 s")
	}
	return ns
}

// Connect connects to ns; the connection is closed when the test ends.
func Connect(t testing.TB, ns *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Conn is a connection to a fresh Server without JetStream.
func Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return Connect(t, Server(t, false))
}
