package natsflags

import (
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    Flags
		ok   bool
	}{
		{"nothing", Flags{}, true},
		{"user and password", Flags{User: "u", Password: "p"}, true},
		{"user alone", Flags{User: "u"}, false},
		{"user and creds", Flags{User: "u", Password: "p", CredFile: file}, false},
		{"missing creds file", Flags{CredFile: file + ".missing"}, false},
		{"cert without key", Flags{CertFile: file}, false},
		{"mutual TLS", Flags{CAFile: file, CertFile: file, KeyFile: file}, true},
	} {
		if err := tc.f.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestCommaSeparatedURLs connects with a URL list whose first node is down, as
// a fleet process does when one cluster node is lost.
func TestCommaSeparatedURLs(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + l.Addr().String()
	_ = l.Close() // only the free port was wanted
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f := Register(fs)
	opts, err := f.Options("test", testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(dead+", "+b.ClientURL(), opts)
	if err != nil {
		t.Fatalf("connect to a list with one live node: %v", err)
	}
	defer nc.Close()
	if nc.ConnectedUrl() != b.ClientURL() {
		t.Fatalf("connected to %s, want %s", nc.ConnectedUrl(), b.ClientURL())
	}
	if _, err := Connect(dead, opts); err == nil {
		t.Fatal("connected to a dead node")
	}
}
