package oauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// maxDocBytes bounds an issuer's metadata, JWKS and introspection answers.
const maxDocBytes = 1 << 20

// metadata is the part of an authorisation server's metadata (OpenID
// Connect discovery or RFC 8414) this package uses.
type metadata struct {
	Issuer                string `json:"issuer"`
	JWKSURI               string `json:"jwks_uri"`
	IntrospectionEndpoint string `json:"introspection_endpoint"`
}

// issuer is one trusted authorisation server: its metadata and keys,
// fetched on first use and refetched when a token names a key it lacks (at
// most once per Config.RefreshInterval).
type issuer struct {
	url string
	cfg *Config

	mu        sync.Mutex // guards the fields below
	meta      *metadata
	keys      []jose.JSONWebKey // public, asymmetric keys only
	fetchedAt time.Time         // last metadata/JWKS fetch attempt
	fetchErr  error             // its error, if it failed
}

// metadataURLs are where an issuer's metadata may be: OpenID Connect
// discovery, then RFC 8414 (its well-known path inserted before the issuer's
// path).
func metadataURLs(iss string) []string {
	out := []string{strings.TrimSuffix(iss, "/") + "/.well-known/openid-configuration"}
	if u, err := url.Parse(iss); err == nil {
		path := strings.TrimSuffix(u.Path, "/")
		u.Path = "/.well-known/oauth-authorization-server" + path
		u.RawPath = ""
		out = append(out, u.String())
	}
	return out
}

// sameIssuer compares issuer identifiers, ignoring a trailing slash.
func sameIssuer(a, b string) bool {
	return a != "" && strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/")
}

// getJSON fetches u into out, bounded by cfg's timeout and maxDocBytes.
func getJSON(ctx context.Context, c *http.Client, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read-only
	return decodeBounded(resp, u, out)
}

// decodeBounded reads a JSON answer of at most maxDocBytes.
func decodeBounded(resp *http.Response, u string, out any) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %s", u, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", u, err)
	}
	if len(body) > maxDocBytes {
		return fmt.Errorf("%s: answer larger than %d bytes", u, maxDocBytes)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: not JSON: %w", u, err)
	}
	return nil
}

// refresh fetches the metadata (if not yet known) and the JWKS. Call with
// mu held.
func (is *issuer) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, is.cfg.FetchTimeout)
	defer cancel()
	is.fetchedAt = is.cfg.Now()
	if is.meta == nil {
		var errs []error
		for _, u := range metadataURLs(is.url) {
			var m metadata
			if err := getJSON(ctx, is.cfg.HTTPClient, u, &m); err != nil {
				errs = append(errs, err)
				continue
			}
			if !sameIssuer(m.Issuer, is.url) {
				errs = append(errs, fmt.Errorf("%s names issuer %q, not %q", u, m.Issuer, is.url))
				continue
			}
			is.meta = &m
			break
		}
		if is.meta == nil {
			return fmt.Errorf("issuer %s: no authorisation server metadata: %w", is.url, errors.Join(errs...))
		}
	}
	if is.meta.JWKSURI == "" {
		is.keys = nil
		return nil
	}
	var set jose.JSONWebKeySet
	if err := getJSON(ctx, is.cfg.HTTPClient, is.meta.JWKSURI, &set); err != nil {
		return fmt.Errorf("issuer %s: JWKS: %w", is.url, err)
	}
	keys := set.Keys[:0]
	for _, k := range set.Keys {
		if usable(k) {
			keys = append(keys, k)
		}
	}
	is.keys = keys
	return nil
}

// usable says a JWKS key may verify signatures: public, asymmetric, valid,
// and not marked for encryption only.
func usable(k jose.JSONWebKey) bool {
	if !k.Valid() || !k.IsPublic() || (k.Use != "" && k.Use != "sig") {
		return false
	}
	switch k.Key.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
		return true
	}
	return false
}

// ensure fetches the metadata and keys on first use, or again when force is
// set (a token names an unknown key) and the last fetch is older than
// RefreshInterval; a failed fetch is retried no sooner than that either.
func (is *issuer) ensure(ctx context.Context, force bool) error {
	is.mu.Lock()
	defer is.mu.Unlock()
	fresh := !is.fetchedAt.IsZero() && is.cfg.Now().Sub(is.fetchedAt) < is.cfg.RefreshInterval
	switch {
	case is.fetchedAt.IsZero():
	case fresh:
		return is.fetchErr
	case is.fetchErr == nil && !force:
		return nil
	}
	is.fetchErr = is.refresh(ctx)
	return is.fetchErr
}

// candidates returns the keys that may have signed a token with header h.
func (is *issuer) candidates(h jose.Header) []jose.JSONWebKey {
	is.mu.Lock()
	defer is.mu.Unlock()
	var out []jose.JSONWebKey
	for _, k := range is.keys {
		if h.KeyID != "" && k.KeyID != h.KeyID {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != h.Algorithm {
			continue
		}
		out = append(out, k)
	}
	return out
}

// introspection returns the issuer's introspection endpoint, if it has one.
func (is *issuer) introspection() string {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.meta == nil {
		return ""
	}
	return is.meta.IntrospectionEndpoint
}

// Probe reads issuer iss's metadata and JWKS as validation would (doctor's
// check) and returns how many signing keys it publishes that are usable.
func Probe(ctx context.Context, iss string) (int, error) {
	cfg := Config{Issuers: []string{iss}, Audience: "https://probe.invalid/mcp"}
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	is := &issuer{url: iss, cfg: &cfg}
	is.mu.Lock()
	defer is.mu.Unlock()
	if err := is.refresh(ctx); err != nil {
		return 0, err
	}
	if len(is.keys) == 0 {
		return 0, fmt.Errorf("issuer %s publishes no usable signing key (jwks_uri %q): JWT access tokens cannot be checked", iss, is.meta.JWKSURI)
	}
	return len(is.keys), nil
}
