package oauth_test

import (
	"context"
	"errors"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/mcpexec/mcpexec/internal/oauth"
)

// BenchmarkValidate is the cost OAuth adds to each request: one RS256 JWT
// checked against cached keys.
func BenchmarkValidate(b *testing.B) {
	f := newIssuer(b)
	k := f.key(b, "k1", true)
	v, err := oauth.New(oauth.Config{Issuers: []string{f.URL}, Audience: audience})
	if err != nil {
		b.Fatal(err)
	}
	raw := mint(b, k, jose.RS256, claims(f.URL, nil))
	ctx := context.Background()
	if _, err := v.Validate(ctx, raw); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Validate(ctx, raw); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzValidate feeds the validator whatever a caller may send: it must never
// panic, and nothing but the issuer's own signed claims may pass.
func FuzzValidate(fz *testing.F) {
	f := newIssuer(fz)
	k := f.key(fz, "k1", true)
	v, err := oauth.New(oauth.Config{Issuers: []string{f.URL}, Audience: audience})
	if err != nil {
		fz.Fatal(err)
	}
	good := mint(fz, k, jose.RS256, claims(f.URL, nil))
	fz.Add(good)
	fz.Add(good[:len(good)-2] + "AA")
	fz.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.")
	fz.Add("a.b.c")
	fz.Fuzz(func(t *testing.T, raw string) {
		tok, err := v.Validate(context.Background(), raw)
		// A variant of good may pass (base64 that decodes alike), but only
		// as the issuer's own claims.
		if err == nil && (tok.Issuer != f.URL || tok.Namespace != "alice" || !tok.Has(oauth.ScopeRun) || tok.Has(oauth.ScopeAdmin)) {
			t.Fatalf("accepted %q as %+v", raw, tok)
		}
		if err != nil && !errors.Is(err, oauth.ErrInvalidToken) {
			t.Fatalf("refusal not invalid_token: %v", err)
		}
	})
}
