package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/oauth"
)

// Caller is who an authenticated request is: the one answer every way of
// authenticating gives (static tokens, OAuth access tokens).
type Caller struct {
	// Namespace is the caller's own namespace.
	Namespace string
	// Admin callers act in any namespace (NamespaceHeader names it).
	Admin bool
	// Scopes are what the caller may do (oauth.ScopeRun, ...); ScopeAdmin
	// grants every other.
	Scopes []string
	// Key groups the caller's requests for the in-flight bound (no secret:
	// a hash).
	Key string
	// Who names the caller in job records and the audit trail, never with
	// a secret: "token:" and a fingerprint of a tokens-file token (the
	// file gives tokens no names), "admin-token:" and one of an admin
	// token, "oauth:" and the issuer and subject of an OAuth token.
	Who string
}

// Can reports whether the caller holds scope.
func (c Caller) Can(scope string) bool {
	return c.Admin || slices.Contains(c.Scopes, scope) || slices.Contains(c.Scopes, oauth.ScopeAdmin)
}

// ErrUnauthenticated is wrapped by every refusal of a bearer token; its text
// says why (it is shown to the caller).
var ErrUnauthenticated = errors.New("invalid_token")

// Authenticator resolves a bearer token to its caller, or an error wrapping
// ErrUnauthenticated.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Caller, error)
}

// StaticTokens authenticates the tokens file's tokens: each names a
// namespace and may use MCP and the jobs API; an admin token may do all.
type StaticTokens struct {
	Tokens      map[string]string
	AdminTokens []string
}

var _ Authenticator = StaticTokens{}

// staticScopes are what a namespace's static token may do.
var staticScopes = []string{oauth.ScopeRun, oauth.ScopeJobs}

// Authenticate implements Authenticator.
func (s StaticTokens) Authenticate(_ context.Context, tok string) (Caller, error) {
	if ns, ok := lookupToken(s.Tokens, tok); ok {
		return Caller{Namespace: ns, Scopes: staticScopes, Key: tokenKey(tok), Who: "token:" + fingerprint(tok)}, nil
	}
	if isAdminToken(s.AdminTokens, tok) {
		return Caller{Namespace: jobs.DefaultNamespace, Admin: true, Scopes: []string{oauth.ScopeAdmin}, Key: tokenKey(tok), Who: "admin-token:" + fingerprint(tok)}, nil
	}
	return Caller{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
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
	c := Caller{Namespace: t.Namespace, Scopes: t.Scopes, Key: tokenKey("oauth\x00" + t.Issuer + "\x00" + t.Subject), Who: "oauth:" + t.Issuer + "#" + t.Subject}
	if t.Has(oauth.ScopeAdmin) {
		c.Admin = true
	}
	return c, nil
}

// fingerprint names a static token without revealing it: the first 12 hex
// digits of its SHA-256 under a label of its own (so it is not a prefix of
// tokenKey).
func fingerprint(tok string) string {
	sum := sha256.Sum256([]byte("mcpexec token fingerprint\x00" + tok))
	return hex.EncodeToString(sum[:6])
}

// reason is an authentication error's text without its code.
func reason(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), ErrUnauthenticated.Error()+": "), oauth.ErrInvalidToken.Error()+": ")
}

// authenticators are the ways opts authenticates, static tokens first; nil:
// no auth (loopback only).
func (opts HTTPOptions) authenticators() []Authenticator {
	var out []Authenticator
	if len(opts.Tokens) > 0 || len(opts.AdminTokens) > 0 {
		out = append(out, StaticTokens{Tokens: opts.Tokens, AdminTokens: opts.AdminTokens})
	}
	if opts.OAuth != nil {
		out = append(out, OAuthTokens{V: opts.OAuth})
	}
	return out
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
