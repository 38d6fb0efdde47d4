package httpauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
)

// ErrUnauthenticated is wrapped by every refusal of a bearer token; its text
// says why (it is shown to the caller).
var ErrUnauthenticated = errors.New("invalid_token")

// Authenticator resolves a bearer token to its caller, or an error wrapping
// ErrUnauthenticated.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Caller, error)
}

// ScopeMetrics is what a metrics token may do: read /metrics, and nothing
// else (no MCP, no jobs API). Only metrics tokens hold it; no other way of
// authenticating grants it.
const ScopeMetrics = "mcpexec:metrics"

// StaticTokens authenticates the tokens file's tokens: each of Tokens names
// a namespace and may use MCP and the jobs API; an admin token may do all
// but read metrics; a metrics token may read metrics only.
type StaticTokens struct {
	Tokens        map[string]string
	AdminTokens   []string
	MetricsTokens []string
}

var _ Authenticator = StaticTokens{}

// staticScopes are what a namespace's static token may do.
var staticScopes = []string{oauth.ScopeRun, oauth.ScopeJobs}

// Authenticate implements Authenticator.
func (s StaticTokens) Authenticate(_ context.Context, tok string) (Caller, error) {
	if tok != "" {
		for t, ns := range s.Tokens {
			if equal(t, tok) {
				return Caller{Namespace: ns, Scopes: staticScopes, Key: TokenKey(tok), Who: "token:" + fingerprint(tok)}, nil
			}
		}
		if anyEqual(s.AdminTokens, tok) {
			return Caller{Namespace: jobs.DefaultNamespace, Admin: true, Scopes: []string{oauth.ScopeAdmin}, Key: TokenKey(tok), Who: "admin-token:" + fingerprint(tok)}, nil
		}
		if anyEqual(s.MetricsTokens, tok) {
			return Caller{Scopes: []string{ScopeMetrics}, Key: TokenKey(tok), Who: "metrics-token:" + fingerprint(tok)}, nil
		}
	}
	return Caller{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
}

// equal compares a configured token with a presented one in constant time.
func equal(configured, tok string) bool {
	return subtle.ConstantTimeCompare([]byte(configured), []byte(tok)) == 1
}

// anyEqual reports whether tok is one of tokens, comparing with each.
func anyEqual(tokens []string, tok string) bool {
	found := false
	for _, t := range tokens {
		if equal(t, tok) {
			found = true
		}
	}
	return found
}

// OAuthTokens authenticates OAuth access tokens with v: the namespace is
// the token's namespace claim, the scopes its scopes; mcpexec:admin makes
// an admin.
type OAuthTokens struct{ V *oauth.Validator }

var _ Authenticator = OAuthTokens{}

// Authenticate implements Authenticator.
func (o OAuthTokens) Authenticate(ctx context.Context, tok string) (Caller, error) {
	t, err := o.V.Validate(ctx, tok)
	if errors.Is(err, oauth.ErrOpaque) {
		return Caller{}, fmt.Errorf("%w: unknown token (neither a token of the tokens file nor a JWT access token)", ErrUnauthenticated)
	}
	if err != nil {
		return Caller{}, fmt.Errorf("%w: %s", ErrUnauthenticated, reason(err))
	}
	c := Caller{Namespace: t.Namespace, Scopes: t.Scopes, Key: TokenKey("oauth\x00" + t.Issuer + "\x00" + t.Subject), Who: "oauth:" + t.Issuer + "#" + t.Subject}
	if t.Has(oauth.ScopeAdmin) {
		c.Admin = true
	}
	return c, nil
}

// TokenKey is the in-flight count key of a token (its hash: the map holds
// no secret).
func TokenKey(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return string(sum[:16])
}

// fingerprint names a static token without revealing it: the first 12 hex
// digits of its SHA-256 under a label of its own (so it is not a prefix of
// TokenKey).
func fingerprint(tok string) string {
	sum := sha256.Sum256([]byte("mcpexec token fingerprint\x00" + tok))
	return hex.EncodeToString(sum[:6])
}

// reason is an authentication error's text without its code.
func reason(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), ErrUnauthenticated.Error()+": "), oauth.ErrInvalidToken.Error()+": ")
}

// authenticate tries each way in turn; the last refusal is the one told.
func authenticate(ctx context.Context, ways []Authenticator, tok string) (Caller, error) {
	err := fmt.Errorf("%w: no token", ErrUnauthenticated)
	if tok == "" {
		return Caller{}, err
	}
	for _, a := range ways {
		var c Caller
		if c, err = a.Authenticate(ctx, tok); err == nil {
			return c, nil
		}
	}
	return Caller{}, err
}
