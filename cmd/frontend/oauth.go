package main

import (
	"flag"
	"log/slog"
	"strings"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/oauth"
)

// oauthFlags make the HTTP surface an OAuth 2.1 resource server.
type oauthFlags struct {
	issuers        issuerList
	audience       string
	namespaceClaim string
	clientID       string
	clientSecret   string
	cfg            *oauth.Config // built by validate; nil: no OAuth
}

// issuerList is a repeatable flag; one value may hold several URLs separated
// by commas (as MCPEXEC_OAUTH_ISSUER may).
type issuerList []string

func (l *issuerList) String() string { return strings.Join(*l, ",") }

func (l *issuerList) Set(v string) error {
	for _, u := range strings.Split(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			*l = append(*l, u)
		}
	}
	return nil
}

func registerOAuthFlags(fs *flag.FlagSet) *oauthFlags {
	o := &oauthFlags{}
	fs.Var(&o.issuers, "oauth-issuer", "issuer URL of an OAuth authorisation server whose access tokens /mcp and /api accept (beside the tokens file's); repeatable")
	fs.StringVar(&o.audience, "oauth-audience", "", "this server's resource identifier that access tokens must name in aud (RFC 8707): the public URL of /mcp; default http://<--http>/mcp on loopback, required otherwise")
	fs.StringVar(&o.namespaceClaim, "oauth-namespace-claim", "sub", "access token claim whose value is the caller's namespace (mapped through the tokens file's oauth_namespaces when listed there)")
	fs.StringVar(&o.clientID, "oauth-client-id", "", "client id for token introspection (RFC 7662) of opaque access tokens; absent: JWT access tokens only")
	fs.StringVar(&o.clientSecret, "oauth-client-secret", "", "client secret for token introspection (prefer MCPEXEC_OAUTH_CLIENT_SECRET)")
	return o
}

// validate builds the OAuth configuration from the flags, the listen
// address and the tokens file's namespace mapping.
func (o *oauthFlags) validate(httpAddr string, namespaces map[string]string) error {
	if len(o.issuers) == 0 {
		if len(namespaces) > 0 {
			return cli.Usagef("--auth-tokens-file maps OAuth claims (oauth_namespaces) but no --oauth-issuer is set")
		}
		return nil
	}
	if httpAddr == "" {
		return cli.Usagef("--oauth-issuer applies to the HTTP surface: set --http too")
	}
	aud := o.audience
	if aud == "" {
		if !mcpserver.IsLoopback(httpAddr) {
			return cli.Usagef("--oauth-audience: --http %s listens beyond loopback: set the public URL of /mcp that access tokens are issued for (e.g. https://mcp.example.com/mcp)", httpAddr)
		}
		aud = "http://" + httpAddr + "/mcp"
	}
	cfg := oauth.Config{Issuers: o.issuers, Audience: aud, NamespaceClaim: o.namespaceClaim, Namespaces: namespaces,
		ClientID: o.clientID, ClientSecret: o.clientSecret}
	if err := cfg.Validate(); err != nil {
		return cli.Usagef("--oauth-*: %v", err)
	}
	o.cfg = &cfg
	return nil
}

// validator returns the configured validator (nil without OAuth); addr is
// the address listened on, whose /mcp is the default audience.
func (o *oauthFlags) validator(addr string, log *slog.Logger) (*oauth.Validator, error) {
	if o.cfg == nil {
		return nil, nil
	}
	cfg := *o.cfg
	if o.audience == "" {
		cfg.Audience = "http://" + addr + "/mcp"
	}
	cfg.Logger = log.With("component", "oauth")
	v, err := oauth.New(cfg)
	if err != nil {
		return nil, err
	}
	o.log(v.Config(), log)
	return v, nil
}

// log names the OAuth configuration at start.
func (o *oauthFlags) log(cfg oauth.Config, log *slog.Logger) {
	log.Info("OAuth resource server", "issuers", strings.Join(cfg.Issuers, ","), "audience", cfg.Audience,
		"namespace_claim", cfg.NamespaceClaim, "mapped_claims", len(cfg.Namespaces), "introspection", cfg.ClientID != "",
		"metadata", oauth.MetadataURL(cfg.Audience), "scopes", strings.Join(oauth.Scopes, ","))
}
