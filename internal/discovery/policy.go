package discovery

import (
	"fmt"
	"os/exec"
	"path"
	"strings"
)

// lookPath resolves a command name; a variable so tests can stub it.
var lookPath = exec.LookPath

// Policy is the operator's allow and deny lists of server names. Entries are
// shell globs (path.Match syntax), e.g. "github", "fs-*". Deny wins over allow;
// an empty Allow list allows every name not denied.
type Policy struct {
	Allow []string
	Deny  []string
}

// ParseList splits a comma-separated flag value into trimmed, non-empty items.
func ParseList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Validate checks every pattern.
func (p Policy) Validate() error {
	for _, list := range [][]string{p.Allow, p.Deny} {
		for _, pat := range list {
			if _, err := path.Match(pat, ""); err != nil {
				return fmt.Errorf("server pattern %q: %w (use names or globs like fs-*)", pat, err)
			}
		}
	}
	return nil
}

// Allowed reports whether the policy lets name be used.
func (p Policy) Allowed(name string) bool {
	if matchAny(p.Deny, name) {
		return false
	}
	return len(p.Allow) == 0 || matchAny(p.Allow, name)
}

func matchAny(pats []string, name string) bool {
	for _, pat := range pats {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}
