package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/natsauth"
)

// TestCheckExposureRoutes: a route listener beyond loopback needs routes that
// authenticate (the route secret beside --nats-config, a cluster authorization
// in it, or --auth-user) or verify certificates (--tls-ca); --nats-config alone
// no longer does, though it still does for the client listener.
func TestCheckExposureRoutes(t *testing.T) {
	t.Parallel()
	withSecret := t.TempDir()
	if _, err := natsauth.Init(withSecret, jobs.Subjects{}, false); err != nil {
		t.Fatal(err)
	}
	noSecret := t.TempDir()
	if _, err := natsauth.Init(noSecret, jobs.Subjects{}, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(noSecret, natsauth.RouteSecretName)); err != nil {
		t.Fatal(err)
	}
	clusterAuth := filepath.Join(t.TempDir(), "cluster.conf")
	if err := os.WriteFile(clusterAuth, []byte("cluster { authorization { user: r, password: s3cret } }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := newTestPKI(t)

	exposed := ClusterConfig{Name: "c", Listen: "0.0.0.0:0", Routes: []string{"nats-route://10.0.0.2:6222"}}
	loopback := ClusterConfig{Name: "c", Listen: "127.0.0.1:0"}
	for _, tc := range []struct {
		name    string
		listen  string
		cluster ClusterConfig
		sec     Security
		want    string // "" accepted, else part of the refusal
	}{
		{"nats-config without route.secret", "", exposed, Security{ConfigFile: filepath.Join(noSecret, natsauth.ConfigName)}, "route.secret"},
		{"nats-config with route.secret", "", exposed, Security{ConfigFile: filepath.Join(withSecret, natsauth.ConfigName)}, ""},
		{"nats-config with a cluster authorization", "", exposed, Security{ConfigFile: clusterAuth}, ""},
		{"no security", "", exposed, Security{}, "broker auth init DIR"},
		{"auth user", "", exposed, Security{User: "u", Password: "p"}, ""},
		{"TLS without a CA", "", exposed, Security{TLSCert: pki[0], TLSKey: pki[1]}, "--tls-ca"},
		{"TLS with a CA", "", exposed, Security{TLSCert: pki[0], TLSKey: pki[1], TLSCA: pki[2]}, ""},
		{"loopback routes without security", "", loopback, Security{}, ""},
		{"client listener with nats-config only", "0.0.0.0:0", ClusterConfig{}, Security{ConfigFile: filepath.Join(noSecret, natsauth.ConfigName)}, ""},
		{"client listener without security", "0.0.0.0:0", ClusterConfig{}, Security{}, "--listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Listen: tc.listen, Cluster: tc.cluster, Security: tc.sec}
			opts, err := fleetOptions(&server.Options{}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = checkExposure(cfg, opts)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatal("accepted")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refusal %q does not mention %q", err, tc.want)
			}
		})
	}
}

// newTestPKI writes a self-signed certificate for 127.0.0.1, its key, and the
// certificate again as the CA: the certificate, key and CA files.
func newTestPKI(t *testing.T) [3]string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mcpexec exposure test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var files [3]string
	for i, f := range []struct {
		name, typ string
		der       []byte
	}{{"cert.pem", "CERTIFICATE", der}, {"key.pem", "EC PRIVATE KEY", kder}, {"ca.pem", "CERTIFICATE", der}} {
		files[i] = filepath.Join(dir, f.name)
		if err := os.WriteFile(files[i], pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return files
}
