package httpauth

import (
	"context"
	"regexp"
	"slices"

	"github.com/mcpexec/mcpexec/internal/oauth"
)

// Caller is who an authenticated request is: the one answer every way of
// authenticating gives (static tokens, OAuth access tokens).
type Caller struct {
	// Namespace is the namespace the caller acts in: its own, or, for an
	// admin, the one its request names (NamespaceHeader).
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

// NamespaceHeader names the namespace an admin's request acts in.
const NamespaceHeader = "X-Mcpexec-Namespace"

// namespacePattern is what a namespace may be.
var namespacePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidNamespace reports whether ns may name a namespace: 1-128 letters,
// digits, '.', '_' or '-'.
func ValidNamespace(ns string) bool { return namespacePattern.MatchString(ns) }

type callerKey struct{}

// NewContext returns ctx carrying c.
func NewContext(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// FromContext returns the authenticated caller ctx carries, and whether it
// carries one (none when the server runs without authentication).
func FromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Namespace returns the namespace the authenticated caller acts in, or ""
// (no authentication: the caller of the default namespace).
func Namespace(ctx context.Context) string {
	c, _ := FromContext(ctx)
	return c.Namespace
}

// IsAdmin reports whether the caller authenticated as an admin (an admin
// token, or an OAuth token with mcpexec:admin).
func IsAdmin(ctx context.Context) bool {
	c, _ := FromContext(ctx)
	return c.Admin
}
