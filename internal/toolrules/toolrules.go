// Package toolrules decides, per proxied tool call, whether a namespace's
// policy allows it, denies it, or asks a person first: rules from
// "server/tool" globs to a verdict, and defaults from the tool's MCP
// annotations where no rule matches. It is pure: no I/O, no clock.
//
// Most specific first: an exact "server/tool" rule beats every glob; among
// globs, the one with fewer '*' wins, then the one that fixes more
// characters (a literal, '?' and a class "[a-z]" each fix one), then the one
// with more literal characters, then the lower pattern in byte order (so the
// order never depends on the map the rules came in). So "github/delete_*"
// beats "github/*", which beats "*/*"; "*/delete_repository" beats
// "github/*".
package toolrules

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Verdict is what a rule says of a call.
type Verdict string

// The verdicts.
const (
	Allow Verdict = "allow"
	Deny  Verdict = "deny"
	Ask   Verdict = "ask"
)

// ParseVerdict returns the verdict s names.
func ParseVerdict(s string) (Verdict, error) {
	switch v := Verdict(s); v {
	case Allow, Deny, Ask:
		return v, nil
	}
	return "", fmt.Errorf("verdict %q: want \"allow\", \"deny\" or \"ask\"", s)
}

// Defaults are the verdicts of calls no rule matches, by the tool's MCP
// annotations: Destructive for a tool whose destructiveHint is true (and
// readOnlyHint not), ReadOnly for one whose readOnlyHint is true, Other for
// the rest (no annotations, or neither hint true). Empty fields take
// DefaultDefaults' values.
type Defaults struct {
	Destructive string `json:"destructive,omitempty"`
	ReadOnly    string `json:"read_only,omitempty"`
	Other       string `json:"other,omitempty"`
}

// DefaultDefaults: destructive tools ask, the others are allowed.
func DefaultDefaults() Defaults {
	return Defaults{Destructive: string(Ask), ReadOnly: string(Allow), Other: string(Allow)}
}

// or fills d's empty fields from DefaultDefaults.
func (d Defaults) or() Defaults {
	def := DefaultDefaults()
	return Defaults{Destructive: cmp.Or(d.Destructive, def.Destructive), ReadOnly: cmp.Or(d.ReadOnly, def.ReadOnly), Other: cmp.Or(d.Other, def.Other)}
}

// Hints are a tool's MCP annotations as the rules read them (nil: absent).
type Hints struct {
	ReadOnly    *bool
	Destructive *bool
}

// Decision is a call's verdict and the rule that gave it, as named to the
// code and the approver: the pattern, or "tool_defaults.<kind>".
type Decision struct {
	Verdict Verdict
	Rule    string
}

// rule is one compiled glob rule.
type rule struct {
	pattern           string
	server, tool      string // the pattern's halves
	verdict           Verdict
	stars, fixed, lit int // '*'s; characters fixed; literal ones
}

// shape counts pat's stars, the characters it fixes and its literals.
func shape(pat string) (stars, fixed, lit int) {
	for i := 0; i < len(pat); i++ {
		switch pat[i] {
		case '*':
			stars++
		case '?':
			fixed++
		case '[':
			fixed++
			for i++; i < len(pat) && pat[i] != ']'; i++ {
				if pat[i] == '\\' {
					i++
				}
			}
		case '\\':
			i++
			fixed++
			lit++
		default:
			fixed++
			lit++
		}
	}
	return stars, fixed, lit
}

// Rules are a namespace's compiled rules. The zero value and nil allow
// every call (a namespace without rules, as before rules existed).
type Rules struct {
	exact    map[string]Decision // "server/tool" → its rule's decision
	globs    []rule              // most specific first
	defaults [3]Decision         // destructive, read-only, other
}

// MaxRules bounds a namespace's rules.
const MaxRules = 1000

// Compile checks and compiles rules (pattern → verdict) and defaults. Its
// errors name the offending rule. rules and defaults both empty (nil
// defaults) compile to nil: every call allowed, at no cost.
func Compile(rules map[string]string, defaults *Defaults) (*Rules, error) {
	if len(rules) == 0 && defaults == nil {
		return nil, nil
	}
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("tools: %d rules, over the %d allowed", len(rules), MaxRules)
	}
	r := &Rules{exact: map[string]Decision{}}
	for pat, v := range rules {
		verdict, err := ParseVerdict(v)
		if err != nil {
			return nil, fmt.Errorf("tools rule %q: %w", pat, err)
		}
		server, tool, ok := strings.Cut(pat, "/")
		if !ok || server == "" || tool == "" {
			return nil, fmt.Errorf("tools rule %q: want \"server/tool\" with globs, e.g. \"github/delete_*\" or \"*/*\"", pat)
		}
		for _, half := range []string{server, tool} {
			if _, err := path.Match(half, ""); err != nil {
				return nil, fmt.Errorf("tools rule %q: bad glob %q: %w (use *, ? and [a-z])", pat, half, err)
			}
		}
		if !strings.ContainsAny(pat, `*?[\`) {
			r.exact[pat] = Decision{Verdict: verdict, Rule: pat}
			continue
		}
		g := rule{pattern: pat, server: server, tool: tool, verdict: verdict}
		g.stars, g.fixed, g.lit = shape(pat)
		r.globs = append(r.globs, g)
	}
	slices.SortFunc(r.globs, func(a, b rule) int {
		return cmp.Or(cmp.Compare(a.stars, b.stars), cmp.Compare(b.fixed, a.fixed), cmp.Compare(b.lit, a.lit), strings.Compare(a.pattern, b.pattern))
	})
	d := DefaultDefaults()
	if defaults != nil {
		d = defaults.or()
	}
	for i, kv := range [][2]string{{"destructive", d.Destructive}, {"read_only", d.ReadOnly}, {"other", d.Other}} {
		v, err := ParseVerdict(kv[1])
		if err != nil {
			return nil, fmt.Errorf("tool_defaults.%s: %w", kv[0], err)
		}
		r.defaults[i] = Decision{Verdict: v, Rule: "tool_defaults." + kv[0]}
	}
	return r, nil
}

// Match returns the decision of the most specific rule matching server/tool,
// and whether one matched.
func (r *Rules) Match(server, tool string) (Decision, bool) {
	if r == nil {
		return Decision{Verdict: Allow}, true
	}
	if d, ok := r.exact[server+"/"+tool]; ok {
		return d, true
	}
	for _, g := range r.globs {
		if ok, _ := path.Match(g.server, server); !ok {
			continue
		}
		if ok, _ := path.Match(g.tool, tool); ok {
			return Decision{Verdict: g.verdict, Rule: g.pattern}, true
		}
	}
	return Decision{}, false
}

// Default returns the decision for a call no rule matches, by the tool's
// hints.
func (r *Rules) Default(h Hints) Decision {
	if r == nil {
		return Decision{Verdict: Allow}
	}
	switch {
	case h.ReadOnly != nil && *h.ReadOnly:
		return r.defaults[1]
	case h.Destructive != nil && *h.Destructive:
		return r.defaults[0]
	}
	return r.defaults[2]
}

// Decide returns the decision for a call of server's tool: the most
// specific matching rule's, else the default by the tool's hints (hints is
// called only then). When the hints cannot be read, the tool counts as
// destructive: a rule that cannot be checked does not allow.
func (r *Rules) Decide(server, tool string, hints func() (Hints, error)) Decision {
	if d, ok := r.Match(server, tool); ok {
		return d
	}
	h, err := hints()
	if err != nil {
		d := r.defaults[0]
		d.Rule += " (the tool's annotations could not be read)"
		return d
	}
	return r.Default(h)
}
