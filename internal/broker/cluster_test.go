package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestClusterSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		cfg      broker.ClusterConfig
		size     int
		replicas int
	}{
		{"single node", broker.ClusterConfig{}, 1, 1},
		{"others only", broker.ClusterConfig{Name: "c", Listen: "10.0.0.1:6222", Routes: []string{"nats-route://10.0.0.2:6222", "nats-route://10.0.0.3:6222"}}, 3, 3},
		{"self listed", broker.ClusterConfig{Name: "c", Listen: "0.0.0.0:6222", Routes: []string{"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"}}, 3, 3},
		{"self advertised", broker.ClusterConfig{Name: "c", Listen: "127.0.0.1:7000", Advertise: "127.0.0.1:6222", Routes: []string{"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"}}, 3, 3},
		{"five nodes", broker.ClusterConfig{Name: "c", Listen: "a:1", Routes: []string{"nats-route://b:1", "nats-route://c:1", "nats-route://d:1", "nats-route://e:1"}}, 5, 3},
		{"two nodes", broker.ClusterConfig{Name: "c", Listen: "a:1", Routes: []string{"nats-route://b:1", "nats-route://b:1"}}, 2, 2},
	} {
		if got := tc.cfg.Size(); got != tc.size {
			t.Errorf("%s: Size() = %d, want %d", tc.name, got, tc.size)
		}
		if got := tc.cfg.DefaultReplicas(); got != tc.replicas {
			t.Errorf("%s: DefaultReplicas() = %d, want %d", tc.name, got, tc.replicas)
		}
	}
}

func TestClusterConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  broker.ClusterConfig
		ok   bool
	}{
		{"none", broker.ClusterConfig{}, true},
		{"routes without name", broker.ClusterConfig{Routes: []string{"nats-route://a:1"}}, false},
		{"name without listen", broker.ClusterConfig{Name: "c"}, false},
		{"bad listen", broker.ClusterConfig{Name: "c", Listen: "6222"}, false},
		{"bad route", broker.ClusterConfig{Name: "c", Listen: ":6222", Routes: []string{"http://a:1"}}, false},
		{"good", broker.ClusterConfig{Name: "c", Listen: ":6222", Routes: []string{"nats-route://a:6222"}}, true},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestSecuredBroker runs a broker that requires a user and TLS with client
// certificates: a client with them connects, one without is refused, and the
// broker's own state service works.
func TestSecuredBroker(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	b, err := broker.Start(context.Background(), broker.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Queue: queue.DefaultConfig(), Logger: testutil.Logger(t),
		Security: broker.Security{User: "fleet", Password: "s3cret", TLSCert: pki.serverCert, TLSKey: pki.serverKey, TLSCA: pki.ca},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	url := b.ClientURL()

	if nc, err := nats.Connect(url, nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey)); err == nil {
		nc.Close()
		t.Fatal("connected without a user")
	}
	if nc, err := nats.Connect(url, nats.UserInfo("fleet", "s3cret")); err == nil {
		nc.Close()
		t.Fatal("connected without TLS")
	}
	nc, err := nats.Connect(url, nats.UserInfo("fleet", "s3cret"), nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey))
	if err != nil {
		t.Fatalf("connect with user and client certificate: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(context.Background(), queue.DefaultConfig().Subjects.JobsStream()); err != nil {
		t.Fatalf("jobs stream: %v", err)
	}
	if !b.StateService() {
		t.Fatal("state service did not start under authentication")
	}
}

// TestSecuredCluster forms a 3-node cluster whose routes authenticate and use
// TLS, and checks the streams have 3 replicas and every node runs a state
// replica.
func TestSecuredCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	pki := newPKI(t)
	sec := broker.Security{User: "fleet", Password: "s3cret", TLSCert: pki.serverCert, TLSKey: pki.serverKey, TLSCA: pki.ca}
	c := testutil.StartCluster(t, 3, queue.DefaultConfig(), func(_ int, cfg *broker.Config) { cfg.Security = sec })
	nc, err := nats.Connect(c.URL(), nats.UserInfo("fleet", "s3cret"), nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := queue.DefaultConfig()
	for _, name := range []string{q.Subjects.JobsStream(), q.Subjects.EventsStream()} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
	}
	states := 0
	for _, n := range c.Nodes {
		if n.StateService() {
			states++
		}
	}
	if states != 3 {
		t.Fatalf("%d nodes run a state replica, want all 3", states)
	}
}

type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

// newPKI writes a CA, a server certificate for 127.0.0.1 and localhost, and a
// client certificate to a temp dir.
func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mcpexec test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := pki{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}
