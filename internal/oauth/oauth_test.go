package oauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/oauth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const audience = "https://mcp.example.test/mcp"

// fakeIssuer is an authorisation server's metadata and JWKS, its keys
// changeable while it runs.
type fakeIssuer struct {
	*httptest.Server
	mu         sync.Mutex // guards keys
	keys       []jose.JSONWebKey
	jwksFetch  atomic.Int32
	introspect func(token string) map[string]any
	bigJWKS    bool
}

func newIssuer(t testing.TB) *fakeIssuer {
	t.Helper()
	f := &fakeIssuer{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		m := map[string]string{"issuer": f.URL, "jwks_uri": f.URL + "/jwks"}
		if f.introspect != nil {
			m["introspection_endpoint"] = f.URL + "/introspect"
		}
		_ = json.NewEncoder(w).Encode(m)
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		f.jwksFetch.Add(1)
		if f.bigJWKS {
			_, _ = w.Write([]byte(`{"keys": [` + strings.Repeat(" ", 2<<20) + `]}`))
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: f.keys})
	})
	mux.HandleFunc("POST /introspect", func(w http.ResponseWriter, r *http.Request) {
		if id, secret, ok := r.BasicAuth(); !ok || id != "rs" || secret != "rs-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(f.introspect(r.FormValue("token")))
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// key makes a signing key; published adds its public half to the JWKS.
func (f *fakeIssuer) key(t testing.TB, kid string, published bool) jose.JSONWebKey {
	t.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	k := jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"}
	if published {
		f.mu.Lock()
		f.keys = append(f.keys, k.Public())
		f.mu.Unlock()
	}
	return k
}

// mint signs claims with k.
func mint(t testing.TB, k jose.JSONWebKey, alg jose.SignatureAlgorithm, c any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: k}, (&jose.SignerOptions{}).WithType("at+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func claims(iss string, mod func(m map[string]any)) map[string]any {
	now := time.Now()
	m := map[string]any{"iss": iss, "sub": "alice", "aud": []string{audience}, "exp": now.Add(time.Hour).Unix(),
		"iat": now.Unix(), "nbf": now.Unix(), "scope": "mcpexec:run mcpexec:jobs"}
	if mod != nil {
		mod(m)
	}
	return m
}

func validator(t *testing.T, cfg oauth.Config) *oauth.Validator {
	t.Helper()
	if cfg.Audience == "" {
		cfg.Audience = audience
	}
	v, err := oauth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestValidToken(t *testing.T) {
	f := newIssuer(t)
	k := f.key(t, "k1", true)
	v := validator(t, oauth.Config{Issuers: []string{f.URL}})
	tok, err := v.Validate(context.Background(), mint(t, k, jose.RS256, claims(f.URL, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Namespace != "alice" || !tok.Has(oauth.ScopeRun) || !tok.Has(oauth.ScopeJobs) || tok.Has(oauth.ScopeAdmin) || tok.Issuer != f.URL {
		t.Fatalf("token %+v", tok)
	}
	// Hydra's form: scp as an array, aud as a string, and a trailing slash on iss.
	tok, err = v.Validate(context.Background(), mint(t, k, jose.RS256, claims(f.URL+"/", func(m map[string]any) {
		delete(m, "scope")
		m["scp"] = []string{"mcpexec:admin"}
		m["aud"] = audience
	})))
	if err != nil {
		t.Fatal(err)
	}
	if !tok.Has(oauth.ScopeRun) || !tok.Has(oauth.ScopeAdmin) {
		t.Fatalf("admin scope grants all: %+v", tok)
	}
}

// TestRefusals is the attacker's side: each token is refused as invalid.
func TestRefusals(t *testing.T) {
	f := newIssuer(t)
	k := f.key(t, "k1", true)
	stranger := f.key(t, "k1", false) // same kid, unpublished key
	other := f.key(t, "k-other", false)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v := validator(t, oauth.Config{Issuers: []string{f.URL}, RefreshInterval: time.Hour})
	pubDER, err := x509.MarshalPKIXPublicKey(k.Public().Key)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	header := func(h string) string { return b64([]byte(h)) }
	body := b64(mustJSON(t, claims(f.URL, nil)))
	hmacSigner, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: pubDER}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	hmacTok, err := jwt.Signed(hmacSigner).Claims(claims(f.URL, nil)).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		raw  string
		want string
	}{
		"expired":          {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { m["exp"] = time.Now().Add(-time.Hour).Unix() })), "expired"},
		"no exp":           {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { delete(m, "exp") })), "no exp"},
		"not yet":          {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { m["nbf"] = time.Now().Add(time.Hour).Unix() })), "not valid yet"},
		"other audience":   {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { m["aud"] = "https://other.example.test/mcp" })), "another audience"},
		"no audience":      {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { delete(m, "aud") })), "another audience"},
		"untrusted issuer": {mint(t, k, jose.RS256, claims("https://evil.example.test", nil)), "not trusted"},
		"unknown key":      {mint(t, other, jose.RS256, claims(f.URL, nil)), "does not publish"},
		"forged same kid":  {mint(t, stranger, jose.RS256, claims(f.URL, nil)), "bad signature"},
		"alg none":         {header(`{"alg":"none","typ":"JWT"}`) + "." + body + ".", "accepted algorithm"},
		"alg none kid":     {header(`{"alg":"none","kid":"k1"}`) + "." + body + "." + b64([]byte("x")), "accepted algorithm"},
		"HMAC with public": {hmacTok, "accepted algorithm"},
		"ES256 no key":     {mint(t, jose.JSONWebKey{Key: ec, KeyID: "k1"}, jose.ES256, claims(f.URL, nil)), "does not publish"},
		"bad namespace":    {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { m["sub"] = "a/b" })), "not a namespace"},
		"no namespace":     {mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { delete(m, "sub") })), "no string claim"},
		"too long":         {strings.Repeat("a", oauth.MaxTokenBytes+1), "longer than"},
		"opaque":           {"opaque-token-value", "not a JWT"},
		"garbage":          {"a.b.c", "accepted algorithm"},
		"empty":            {"", "no token"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := v.Validate(context.Background(), c.raw)
			if !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want invalid_token with %q", err, c.want)
			}
		})
	}
	if n := f.jwksFetch.Load(); n != 1 {
		t.Fatalf("JWKS fetched %d times within the refresh interval, want 1", n)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKeyRotation: a token signed by a key published after the JWKS was
// read is accepted once the interval allows a refetch, and no sooner.
func TestKeyRotation(t *testing.T) {
	f := newIssuer(t)
	k1 := f.key(t, "k1", true)
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	v := validator(t, oauth.Config{Issuers: []string{f.URL}, RefreshInterval: time.Minute, Now: clock})
	ctx := context.Background()
	if _, err := v.Validate(ctx, mint(t, k1, jose.RS256, claims(f.URL, nil))); err != nil {
		t.Fatal(err)
	}
	k2 := f.key(t, "k2", true)
	tok2 := mint(t, k2, jose.RS256, claims(f.URL, nil))
	for range 5 {
		if _, err := v.Validate(ctx, tok2); err == nil {
			t.Fatal("refetched the JWKS within the refresh interval")
		}
	}
	if n := f.jwksFetch.Load(); n != 1 {
		t.Fatalf("JWKS fetched %d times, want 1", n)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if _, err := v.Validate(ctx, tok2); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	if n := f.jwksFetch.Load(); n != 2 {
		t.Fatalf("JWKS fetched %d times, want 2", n)
	}
}

func TestNamespaceMapping(t *testing.T) {
	f := newIssuer(t)
	k := f.key(t, "k1", true)
	v := validator(t, oauth.Config{Issuers: []string{f.URL}, NamespaceClaim: "client_id",
		Namespaces: map[string]string{"https://client.example/x": "team-a"}})
	tok, err := v.Validate(context.Background(), mint(t, k, jose.RS256, claims(f.URL, func(m map[string]any) { m["client_id"] = "https://client.example/x" })))
	if err != nil || tok.Namespace != "team-a" {
		t.Fatalf("got %+v, %v", tok, err)
	}
}

func TestJWKSBounded(t *testing.T) {
	f := newIssuer(t)
	k := f.key(t, "k1", true)
	f.bigJWKS = true
	v := validator(t, oauth.Config{Issuers: []string{f.URL}})
	if _, err := v.Validate(context.Background(), mint(t, k, jose.RS256, claims(f.URL, nil))); err == nil || !strings.Contains(err.Error(), "cannot be fetched") {
		t.Fatalf("an oversized JWKS: %v", err)
	}
}

func TestIssuerMismatchRefused(t *testing.T) {
	f := newIssuer(t)
	k := f.key(t, "k1", true)
	// The metadata names f.URL; trusting it under another spelling must fail.
	alias := strings.Replace(f.URL, "127.0.0.1", "localhost", 1)
	v := validator(t, oauth.Config{Issuers: []string{alias}})
	if _, err := v.Validate(context.Background(), mint(t, k, jose.RS256, claims(alias, nil))); err == nil {
		t.Fatal("accepted keys from metadata that names another issuer")
	}
}

func TestIntrospection(t *testing.T) {
	f := newIssuer(t)
	f.introspect = func(tok string) map[string]any {
		exp := time.Now().Add(time.Hour).Unix()
		switch tok {
		case "good-opaque":
			return map[string]any{"active": true, "sub": "bob", "aud": []string{audience}, "scope": "mcpexec:run", "exp": exp}
		case "other-aud":
			return map[string]any{"active": true, "sub": "bob", "aud": "https://other/", "scope": "mcpexec:run", "exp": exp}
		case "expired":
			return map[string]any{"active": true, "sub": "bob", "aud": audience, "exp": time.Now().Add(-time.Hour).Unix()}
		}
		return map[string]any{"active": false}
	}
	v := validator(t, oauth.Config{Issuers: []string{f.URL}, ClientID: "rs", ClientSecret: "rs-secret"})
	ctx := context.Background()
	tok, err := v.Validate(ctx, "good-opaque")
	if err != nil || tok.Namespace != "bob" || !tok.Has(oauth.ScopeRun) || tok.Has(oauth.ScopeJobs) {
		t.Fatalf("got %+v, %v", tok, err)
	}
	for raw, want := range map[string]string{"other-aud": "another audience", "expired": "expired", "revoked": "active"} {
		if _, err := v.Validate(ctx, raw); !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
	noClient := validator(t, oauth.Config{Issuers: []string{f.URL}})
	if _, err := noClient.Validate(ctx, "good-opaque"); !errors.Is(err, oauth.ErrInvalidToken) || !errors.Is(err, oauth.ErrOpaque) {
		t.Errorf("opaque without a client: %v", err)
	}
}

func TestMetadataAndChallenge(t *testing.T) {
	f := newIssuer(t)
	v := validator(t, oauth.Config{Issuers: []string{f.URL}})
	if got := oauth.MetadataURL(audience); got != "https://mcp.example.test/.well-known/oauth-protected-resource/mcp" {
		t.Fatalf("MetadataURL %s", got)
	}
	if got := oauth.MetadataPaths(audience); len(got) != 2 || got[1] != "/.well-known/oauth-protected-resource/mcp" {
		t.Fatalf("MetadataPaths %v", got)
	}
	rec := httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/.well-known/oauth-protected-resource/mcp", nil))
	var m oauth.Metadata
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || m.Resource != audience || len(m.AuthorizationServers) != 1 || m.AuthorizationServers[0] != f.URL {
		t.Fatalf("metadata %s: %v", rec.Body, err)
	}
	got := v.Challenge("insufficient_scope", `needs "run"`+"\n", oauth.ScopeRun)
	want := `Bearer resource_metadata="https://mcp.example.test/.well-known/oauth-protected-resource/mcp", error="insufficient_scope", error_description="needs 'run''", scope="mcpexec:run"`
	if got != want {
		t.Fatalf("challenge\n got %s\nwant %s", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]oauth.Config{
		"no issuer":     {Audience: audience},
		"issuer query":  {Issuers: []string{"https://as.example/?x=1"}, Audience: audience},
		"not a URL":     {Issuers: []string{"as.example"}, Audience: audience},
		"relative aud":  {Issuers: []string{"https://as.example"}, Audience: "/mcp"},
		"bad mapping":   {Issuers: []string{"https://as.example"}, Audience: audience, Namespaces: map[string]string{"x": "a b"}},
		"half a client": {Issuers: []string{"https://as.example"}, Audience: audience, ClientID: "x"},
	} {
		if _, err := oauth.New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
