// Package oauthtest is a minimal authorisation server for tests: it
// publishes metadata and a JWKS and mints access tokens, good and bad.
package oauthtest

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Issuer serves /.well-known/openid-configuration and /jwks for one key.
type Issuer struct {
	*httptest.Server
	Key jose.JSONWebKey // the published signing key (private half)
}

// NewIssuer starts an issuer, closed when t ends.
func NewIssuer(t testing.TB) *Issuer {
	t.Helper()
	is := &Issuer{Key: NewKey(t, "test-key")}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": is.URL, "jwks_uri": is.URL + "/jwks"})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{is.Key.Public()}})
	})
	is.Server = httptest.NewServer(mux)
	t.Cleanup(is.Close)
	return is
}

// NewKey makes an RSA signing key named kid.
func NewKey(t testing.TB, kid string) jose.JSONWebKey {
	t.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"}
}

// Claims are a token's claims for audience: subject sub, the given scopes,
// an hour to live.
func (is *Issuer) Claims(audience, sub, scope string) map[string]any {
	now := time.Now()
	return map[string]any{"iss": is.URL, "sub": sub, "aud": []string{audience}, "scope": scope,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

// Mint signs claims with the issuer's key.
func (is *Issuer) Mint(t testing.TB, claims map[string]any) string {
	t.Helper()
	return Sign(t, is.Key, claims)
}

// Sign signs claims with key (RS256).
func Sign(t testing.TB, key jose.JSONWebKey, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("at+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Unsigned is claims as an "alg": "none" token.
func Unsigned(t testing.TB, claims map[string]any) string {
	t.Helper()
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(body) + "."
}
