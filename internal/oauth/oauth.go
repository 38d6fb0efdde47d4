package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Scopes a token may carry, and what each lets its caller do.
const (
	// ScopeRun lets a caller use the MCP endpoint (run_python and the other tools).
	ScopeRun = "mcpexec:run"
	// ScopeJobs lets a caller use the jobs API (/api/...) and the console's calls.
	ScopeJobs = "mcpexec:jobs"
	// ScopeAdmin is an admin token's equivalent: every namespace (named by
	// the X-Mcpexec-Namespace header), and every other scope.
	ScopeAdmin = "mcpexec:admin"
)

// Scopes lists every scope mcpexec knows, for metadata and challenges.
var Scopes = []string{ScopeRun, ScopeJobs, ScopeAdmin}

// MaxTokenBytes bounds an access token: a longer one is refused unread.
const MaxTokenBytes = 16 << 10

// Algorithms are the only JWS algorithms accepted: asymmetric ones, so a
// published key can never verify an HMAC, and never "none".
var Algorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// Config says which authorisation servers to trust and for what resource.
type Config struct {
	// Issuers are the trusted authorisation servers' issuer identifiers
	// (URLs); a token's iss must be one of them.
	Issuers []string
	// Audience is this resource server's identifier (RFC 8707): a token's
	// aud must contain it. The public URL of the MCP endpoint.
	Audience string
	// NamespaceClaim names the claim whose value is the caller's namespace
	// (through Namespaces when listed there); default "sub".
	NamespaceClaim string
	// Namespaces maps a claim value to a namespace; a value not listed is
	// the namespace itself when it is a valid namespace name.
	Namespaces map[string]string
	// ClientID and ClientSecret authenticate introspection (RFC 7662) of
	// opaque tokens at issuers that advertise it; empty: JWTs only.
	ClientID, ClientSecret string
	// HTTPClient fetches metadata and keys; default http.DefaultClient.
	HTTPClient *http.Client
	// FetchTimeout bounds one metadata, JWKS or introspection exchange;
	// default 10s.
	FetchTimeout time.Duration
	// RefreshInterval is the least time between two fetches of one
	// issuer's keys (a token naming an unknown key asks for one); default 30s.
	RefreshInterval time.Duration
	// Leeway is the clock skew allowed on exp, nbf and iat; default 30s.
	Leeway time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger receives fetch failures; default discards.
	Logger *slog.Logger
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if len(c.Issuers) == 0 {
		return errors.New("issuers: at least one issuer URL is needed")
	}
	for _, iss := range c.Issuers {
		u, err := url.Parse(iss)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("issuers: %q is not an issuer URL (https://host[/path], no query or fragment)", iss)
		}
	}
	u, err := url.Parse(c.Audience)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Fragment != "" {
		return fmt.Errorf("audience: %q is not an absolute URL without a fragment (the public URL of the MCP endpoint, e.g. https://mcp.example.com/mcp)", c.Audience)
	}
	if c.NamespaceClaim == "" {
		c.NamespaceClaim = "sub"
	}
	for v, ns := range c.Namespaces {
		if !namespacePattern.MatchString(ns) {
			return fmt.Errorf("namespaces: %q maps to %q, which is not 1-128 letters, digits, '.', '_' or '-'", v, ns)
		}
	}
	if (c.ClientID == "") != (c.ClientSecret == "") {
		return errors.New("client id and secret: set both (for introspection) or neither")
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = 10 * time.Second
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = 30 * time.Second
	}
	if c.Leeway <= 0 {
		c.Leeway = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

var namespacePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Token is what a valid access token says about its caller.
type Token struct {
	Issuer    string
	Subject   string
	Namespace string
	Scopes    []string
	Expiry    time.Time
}

// Has reports whether the token grants scope (mcpexec:admin grants all).
func (t Token) Has(scope string) bool {
	return slices.Contains(t.Scopes, scope) || slices.Contains(t.Scopes, ScopeAdmin)
}

// ErrInvalidToken is wrapped by every refusal of a token: the caller
// answers 401 with error="invalid_token".
var ErrInvalidToken = errors.New("invalid_token")

// ErrOpaque is wrapped (with ErrInvalidToken) by the refusal of a token that
// is not a JWT when no introspection client is configured: a caller that
// has other kinds of tokens may say so instead.
var ErrOpaque = errors.New("not a JWT")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidToken, fmt.Sprintf(format, a...))
}

// Validator validates access tokens from Config's issuers.
type Validator struct {
	cfg     Config
	issuers []*issuer
}

// New returns a Validator; it fetches nothing until the first token.
func New(cfg Config) (*Validator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &Validator{cfg: cfg}
	for _, iss := range cfg.Issuers {
		v.issuers = append(v.issuers, &issuer{url: iss, cfg: &v.cfg})
	}
	return v, nil
}

// Config returns the validator's configuration, defaults filled in.
func (v *Validator) Config() Config { return v.cfg }

// claims are the registered claims plus the ones read by name.
type claims struct {
	jwt.Claims
	Scope any `json:"scope"` // RFC 9068: space-separated string
	Scp   any `json:"scp"`   // Hydra, Okta, Entra: array (or string)
}

// Validate checks raw (a JWT, or an opaque token introspected at an issuer
// that advertises introspection when a client is configured) and returns
// what it says. Every refusal wraps ErrInvalidToken; its text says why.
func (v *Validator) Validate(ctx context.Context, raw string) (Token, error) {
	if raw == "" {
		return Token{}, invalid("no token")
	}
	if len(raw) > MaxTokenBytes {
		return Token{}, invalid("token longer than %d bytes", MaxTokenBytes)
	}
	if strings.Count(raw, ".") != 2 {
		return v.introspect(ctx, raw)
	}
	tok, err := jwt.ParseSigned(raw, Algorithms)
	if err != nil {
		return Token{}, invalid("not a JWT signed with an accepted algorithm (%s): %v", algNames(), err)
	}
	if len(tok.Headers) != 1 {
		return Token{}, invalid("want one signature")
	}
	var unverified jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return Token{}, invalid("claims: %v", err)
	}
	is := v.issuer(unverified.Issuer)
	if is == nil {
		return Token{}, invalid("issuer %q is not trusted here", unverified.Issuer)
	}
	if err := is.ensure(ctx, false); err != nil {
		v.cfg.Logger.Warn("OAuth issuer unreachable", "issuer", is.url, "err", err)
		return Token{}, invalid("the keys of issuer %s cannot be fetched now", is.url)
	}
	keys := is.candidates(tok.Headers[0])
	if len(keys) == 0 {
		if err := is.ensure(ctx, true); err != nil {
			v.cfg.Logger.Warn("OAuth issuer unreachable", "issuer", is.url, "err", err)
		}
		keys = is.candidates(tok.Headers[0])
	}
	if len(keys) == 0 {
		return Token{}, invalid("signed by key %q, which issuer %s does not publish", tok.Headers[0].KeyID, is.url)
	}
	var c claims
	var extra map[string]any
	verified := false
	for _, k := range keys {
		if err := tok.Claims(k.Key, &c, &extra); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return Token{}, invalid("bad signature")
	}
	if c.Expiry == nil {
		return Token{}, invalid("no exp claim")
	}
	if err := c.ValidateWithLeeway(jwt.Expected{Issuer: unverified.Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: v.cfg.Now()}, v.cfg.Leeway); err != nil {
		return Token{}, invalid("%s (this resource is %s)", describe(err), v.cfg.Audience)
	}
	scopes := scopeList(c.Scope)
	if c.Scope == nil {
		scopes = scopeList(c.Scp)
	}
	return v.token(unverified.Issuer, c.Subject, extra, scopes, c.Expiry.Time())
}

// describe turns go-jose's claim errors into words for the challenge.
func describe(err error) string {
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return "token expired"
	case errors.Is(err, jwt.ErrNotValidYet):
		return "token not valid yet"
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return "token issued in the future"
	case errors.Is(err, jwt.ErrInvalidAudience):
		return "token is for another audience"
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return "token from another issuer"
	}
	return err.Error()
}

func algNames() string {
	var s []string
	for _, a := range Algorithms {
		s = append(s, string(a))
	}
	return strings.Join(s, ", ")
}

// issuer returns the trusted issuer named iss, or nil.
func (v *Validator) issuer(iss string) *issuer {
	for _, is := range v.issuers {
		if sameIssuer(iss, is.url) {
			return is
		}
	}
	return nil
}

// token maps a validated token's claims to its namespace.
func (v *Validator) token(iss, sub string, extra map[string]any, scopes []string, exp time.Time) (Token, error) {
	val, ok := extra[v.cfg.NamespaceClaim].(string)
	if !ok || val == "" {
		return Token{}, invalid("no string claim %q to take the namespace from", v.cfg.NamespaceClaim)
	}
	ns, mapped := v.cfg.Namespaces[val]
	if !mapped {
		if !namespacePattern.MatchString(val) {
			return Token{}, invalid("claim %s %q is not a namespace name: map it to one under oauth_namespaces in the tokens file", v.cfg.NamespaceClaim, val)
		}
		ns = val
	}
	return Token{Issuer: iss, Subject: sub, Namespace: ns, Scopes: scopes, Expiry: exp}, nil
}

// scopeList reads a scope claim: a space-separated string or an array.
func scopeList(v any) []string {
	switch s := v.(type) {
	case string:
		return strings.Fields(s)
	case []any:
		var out []string
		for _, e := range s {
			if str, ok := e.(string); ok {
				out = append(out, str)
			}
		}
		return out
	}
	return nil
}

// introspection is the part of an RFC 7662 answer used here.
type introspection struct {
	Active bool            `json:"active"`
	Scope  string          `json:"scope"`
	Sub    string          `json:"sub"`
	Iss    string          `json:"iss"`
	Aud    json.RawMessage `json:"aud"`
	Exp    int64           `json:"exp"`
	Nbf    int64           `json:"nbf"`
}

// introspect asks the issuers that advertise introspection about an opaque
// token; the first that calls it active decides.
func (v *Validator) introspect(ctx context.Context, raw string) (Token, error) {
	if v.cfg.ClientID == "" {
		return Token{}, fmt.Errorf("%w: %w (opaque access tokens need introspection: configure an OAuth client id and secret)", ErrInvalidToken, ErrOpaque)
	}
	for _, is := range v.issuers {
		if err := is.ensure(ctx, false); err != nil {
			continue
		}
		endpoint := is.introspection()
		if endpoint == "" {
			continue
		}
		r, all, err := v.ask(ctx, endpoint, raw)
		if err != nil {
			v.cfg.Logger.Warn("OAuth introspection failed", "issuer", is.url, "err", err)
			continue
		}
		if !r.Active {
			continue
		}
		if r.Iss != "" && !sameIssuer(r.Iss, is.url) {
			return Token{}, invalid("introspection names issuer %q", r.Iss)
		}
		var aud jwt.Audience
		if len(r.Aud) == 0 || json.Unmarshal(r.Aud, &aud) != nil || !aud.Contains(v.cfg.Audience) {
			return Token{}, invalid("token is for another audience (this resource is %s)", v.cfg.Audience)
		}
		now := v.cfg.Now()
		if r.Exp == 0 || now.After(time.Unix(r.Exp, 0).Add(v.cfg.Leeway)) {
			return Token{}, invalid("token expired")
		}
		if r.Nbf != 0 && now.Add(v.cfg.Leeway).Before(time.Unix(r.Nbf, 0)) {
			return Token{}, invalid("token not valid yet")
		}
		return v.token(is.url, r.Sub, all, strings.Fields(r.Scope), time.Unix(r.Exp, 0))
	}
	return Token{}, invalid("not a JWT, and no issuer's introspection calls it active")
}

// ask posts one introspection request; it returns the answer's members
// both read and whole (the namespace claim may be any of them).
func (v *Validator) ask(ctx context.Context, endpoint, raw string) (introspection, map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, v.cfg.FetchTimeout)
	defer cancel()
	var out introspection
	var all map[string]any
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(url.Values{"token": {raw}, "token_type_hint": {"access_token"}}.Encode()))
	if err != nil {
		return out, nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(v.cfg.ClientID), url.QueryEscape(v.cfg.ClientSecret))
	resp, err := v.cfg.HTTPClient.Do(req)
	if err != nil {
		return out, nil, err
	}
	defer func() { _ = resp.Body.Close() }() // read-only
	var body json.RawMessage
	if err := decodeBounded(resp, endpoint, &body); err != nil {
		return out, nil, err
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return out, nil, fmt.Errorf("%s: %w", endpoint, err)
	}
	return out, all, json.Unmarshal(body, &all)
}
