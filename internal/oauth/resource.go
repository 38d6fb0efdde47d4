package oauth

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// MetadataPath is where protected resource metadata is served (RFC 9728);
// a resource with a path has it there too, suffixed (MetadataURL).
const MetadataPath = "/.well-known/oauth-protected-resource"

// MetadataURL is the metadata URL of resource (RFC 9728 §3.1): the
// well-known path inserted between its host and its path.
func MetadataURL(resource string) string {
	u, err := url.Parse(resource)
	if err != nil {
		return ""
	}
	u.Path = MetadataPath + strings.TrimSuffix(u.Path, "/")
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u.String()
}

// MetadataPaths are the paths to serve the metadata at: the plain one, and
// the one MetadataURL names when the resource has a path.
func MetadataPaths(resource string) []string {
	out := []string{MetadataPath}
	if u, err := url.Parse(MetadataURL(resource)); err == nil && u.Path != MetadataPath {
		out = append(out, u.Path)
	}
	return out
}

// Metadata is the protected resource metadata document (RFC 9728 §2).
type Metadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name,omitempty"`
	ResourceDocumentation  string   `json:"resource_documentation,omitempty"`
}

// Metadata returns the validator's protected resource metadata.
func (v *Validator) Metadata() Metadata {
	return Metadata{
		Resource:               v.cfg.Audience,
		AuthorizationServers:   append([]string(nil), v.cfg.Issuers...),
		ScopesSupported:        append([]string(nil), Scopes...),
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "mcpexec",
	}
}

// MetadataHandler serves Metadata as JSON to anyone (it is public, and
// browser-based clients read it across origins).
func (v *Validator) MetadataHandler() http.Handler {
	body, _ := json.Marshal(v.Metadata()) // plain strings: cannot fail
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodOptions {
			w.Header().Set("Access-Control-Allow-Methods", "GET")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "public, max-age=3600")
		_, _ = w.Write(body) // the client went away: nothing to tell it
	})
}

// Challenge is the WWW-Authenticate value of a refusal (RFC 6750 §3, RFC
// 9728 §5.1): code is "" (no token sent), "invalid_token" or
// "insufficient_scope"; scope is what the request needs.
func (v *Validator) Challenge(code, description, scope string) string {
	parts := []string{`Bearer resource_metadata="` + quoted(MetadataURL(v.cfg.Audience)) + `"`}
	if code != "" {
		parts = append(parts, `error="`+quoted(code)+`"`)
	}
	if description != "" {
		parts = append(parts, `error_description="`+quoted(description)+`"`)
	}
	if scope != "" {
		parts = append(parts, `scope="`+quoted(scope)+`"`)
	}
	return strings.Join(parts, ", ")
}

// quoted makes s safe inside a quoted-string: RFC 6750 allows no '"' or
// '\' (nor control characters) in its parameters.
func quoted(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < 0x20 || r > 0x7e {
			return '\''
		}
		return r
	}, s)
}
