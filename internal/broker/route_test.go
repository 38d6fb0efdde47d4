package broker_test

import (
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestAuthInitClusterRefusesRogueRoutes forms a two-node cluster from the
// configuration `broker auth init` wrote (its routes authenticate with the
// route secret), then points strangers' nats-servers at a node's cluster port:
// one without credentials and one with a wrong password never become routes,
// and a client of theirs reads nothing published in the cluster. A stranger
// with the secret does join and read: the refusals are the route
// authentication's, not the test's.
func TestAuthInitClusterRefusesRogueRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	dir := t.TempDir()
	if _, err := natsauth.Init(dir, jobs.Subjects{}, false); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, natsauth.ConfigName)
	seed, _ := natsauth.BrokerSeed(conf)
	bopt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.StartCluster(t, 2, queue.DefaultConfig(), func(_ int, cfg *broker.Config) {
		cfg.Security = broker.Security{ConfigFile: conf}
		cfg.ClientOptions = []nats.Option{bopt}
	})
	victim := c.Nodes[0].Server()
	for i, n := range c.Nodes {
		if r := n.Server().NumRemotes(); r != 1 {
			t.Fatalf("node %d has %d remote servers, want 1", i, r)
		}
	}
	clusterPort := victim.ClusterAddr().Port
	secret, ok, err := natsauth.RouteSecret(conf)
	if err != nil || !ok {
		t.Fatalf("route secret: %q %v %v", secret, ok, err)
	}
	pub, err := nats.Connect(c.URLs[0], bopt, nats.Name("victim publisher"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	for _, tc := range []struct {
		name     string
		userinfo *url.Userinfo
		joins    bool
	}{
		{"no credentials", nil, false},
		{"wrong password", url.UserPassword(natsauth.RouteUser, secret+"x"), false},
		{"the route secret", url.UserPassword(natsauth.RouteUser, secret), true}, // the control
	} {
		t.Run(tc.name, func(t *testing.T) {
			route := &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", clusterPort), User: tc.userinfo}
			rogue, err := server.NewServer(&server.Options{
				ServerName: "rogue", Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
				Cluster: server.ClusterOpts{Name: "mcpexec-test", Host: "127.0.0.1", Port: -1},
				Routes:  []*url.URL{route},
			})
			if err != nil {
				t.Fatal(err)
			}
			rogue.Start()
			defer func() {
				rogue.Shutdown()
				rogue.WaitForShutdown()
			}()
			if !rogue.ReadyForConnections(10 * time.Second) {
				t.Fatal("the rogue server did not start")
			}
			// A client of the rogue server, without credentials (it has none).
			spy, err := nats.Connect(rogue.ClientURL(), nats.Name("spy"))
			if err != nil {
				t.Fatal(err)
			}
			defer spy.Close()
			got := make(chan string, 1024)
			if _, err := spy.Subscribe(">", func(m *nats.Msg) {
				select {
				case got <- m.Subject:
				default:
				}
			}); err != nil {
				t.Fatal(err)
			}
			if err := spy.Flush(); err != nil {
				t.Fatal(err)
			}

			// Publish on the victim while the rogue server keeps trying its route.
			deadline := time.Now().Add(2 * time.Second)
			joined, read := false, ""
			for time.Now().Before(deadline) && !(joined && read != "") {
				if err := pub.Publish("mcpexec.secret.tenant", []byte("every tenant's memory")); err != nil {
					t.Fatal(err)
				}
				// Joined: the victim took it as a route. The rogue's own count
				// is no evidence: it registers the victim as a route as soon
				// as it reads the victim's INFO, which the victim sends on
				// accepting, before it reads the rogue's CONNECT and refuses
				// it (a wrong password was seen "joined" so, with nothing
				// read).
				if victim.NumRemotes() > 1 {
					joined = true
				}
				select {
				case s := <-got:
					read = s
				case <-time.After(50 * time.Millisecond):
				}
			}
			if tc.joins {
				if !joined || read == "" {
					t.Fatalf("a server with the route secret: joined %v, read %q; want both (the control)", joined, read)
				}
				return
			}
			if joined {
				t.Fatalf("the rogue server became a route: victim has %d remote servers, the rogue %d", victim.NumRemotes(), rogue.NumRemotes())
			}
			if read != "" {
				t.Fatalf("a client of the rogue server read %q published in the cluster", read)
			}
			if r := victim.NumRemotes(); r != 1 {
				t.Fatalf("victim has %d remote servers, want its 1 peer", r)
			}
		})
	}
}
