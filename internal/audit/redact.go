package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Redacted replaces what redaction hides.
const Redacted = "[redacted]"

// DefaultNames are the argument names redacted in every namespace (see
// Redaction.Names for how a name matches).
var DefaultNames = []string{"password", "passwd", "passphrase", "secret", "token", "apikey", "authorization", "auth", "credential", "credentials", "privatekey", "cookie"}

// Bounds of a namespace's redaction settings.
const (
	MaxPatterns     = 32
	MaxPatternBytes = 1 << 10
	MaxNames        = 64
)

// Redaction is what a namespace's policy hides in the previews of its
// calls' arguments (the policy's `redact`).
type Redaction struct {
	// Names are argument names whose values are replaced by Redacted at any
	// depth, in addition to DefaultNames. A key matches a name when, lower
	// case and without '-', '_' and '.', it equals the name (so normalised)
	// or ends with it: "api_key", "X-Api-Key" and "github_token" match
	// "apikey" and "token"; "max_tokens" does not match "token".
	Names []string `json:"names,omitempty"`
	// Patterns are regular expressions (RE2) whose matches in the preview's
	// text are replaced by Redacted; a match longer than PreviewBytes is
	// not guaranteed to be caught.
	Patterns []string `json:"patterns,omitempty"`
}

// Validate says what is wrong with r, naming the field.
func (r Redaction) Validate() error {
	if len(r.Names) > MaxNames {
		return fmt.Errorf("redact.names has %d names, at most %d", len(r.Names), MaxNames)
	}
	if len(r.Patterns) > MaxPatterns {
		return fmt.Errorf("redact.patterns has %d patterns, at most %d", len(r.Patterns), MaxPatterns)
	}
	for i, p := range r.Patterns {
		if len(p) > MaxPatternBytes {
			return fmt.Errorf("redact.patterns[%d] is %d bytes, at most %d", i, len(p), MaxPatternBytes)
		}
		if _, err := regexp.Compile(p); err != nil {
			return fmt.Errorf("redact.patterns[%d]: %w", i, err)
		}
	}
	return nil
}

// Redactor applies a Redaction; make one with Compile (the zero value
// redacts DefaultNames only).
type Redactor struct {
	names    map[string]bool // normalised
	patterns []*regexp.Regexp
}

// Compile returns r's Redactor; r must be valid (Validate).
func (r Redaction) Compile() (*Redactor, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	out := &Redactor{names: map[string]bool{}}
	for _, n := range append(append([]string(nil), DefaultNames...), r.Names...) {
		if n = normalise(n); n != "" {
			out.names[n] = true
		}
	}
	for _, p := range r.Patterns {
		out.patterns = append(out.patterns, regexp.MustCompile(p)) // compiled by Validate
	}
	return out, nil
}

// DefaultRedactor redacts DefaultNames only.
var DefaultRedactor, _ = Redaction{}.Compile()

func normalise(name string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '-', '_', '.', ' ':
			return -1
		}
		return r
	}, strings.ToLower(name))
}

// secretName reports whether an argument named key is redacted.
func (x *Redactor) secretName(key string) bool {
	k := normalise(key)
	if x.names[k] {
		return true
	}
	for n := range x.names {
		if strings.HasSuffix(k, n) {
			return true
		}
	}
	return false
}

// redact returns v with the values of secret names replaced, and whether
// anything was (v itself is never changed).
func (x *Redactor) redact(v any) (any, bool) {
	switch t := v.(type) {
	case map[string]any:
		var out map[string]any
		for k, val := range t {
			if x.secretName(k) {
				out = copyOnce(out, t)
				out[k] = Redacted
			} else if nv, changed := x.redact(val); changed {
				out = copyOnce(out, t)
				out[k] = nv
			}
		}
		if out == nil {
			return v, false
		}
		return out, true
	case []any:
		var out []any
		for i, val := range t {
			if nv, c := x.redact(val); c {
				if out == nil {
					out = append([]any(nil), t...)
				}
				out[i] = nv
			}
		}
		if out == nil {
			return v, false
		}
		return out, true
	}
	return v, false
}

func copyOnce(out, src map[string]any) map[string]any {
	if out != nil {
		return out
	}
	out = make(map[string]any, len(src))
	for k, v := range src {
		out[k] = v
	}
	return out
}

// Canonical is the canonical JSON of a call's arguments: encoding/json's
// (object keys sorted, no insignificant space, HTML characters unescaped).
func Canonical(args map[string]any) ([]byte, error) {
	if args == nil {
		args = map[string]any{}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(args); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Digest fills e's argument fields from args: the SHA-256 and length of the
// canonical JSON, and its first PreviewBytes with secret names' values and
// the patterns' matches redacted. However large the arguments, the entry
// holds at most PreviewBytes of them.
func (x *Redactor) Digest(e *Entry, args map[string]any) {
	if x == nil {
		x = DefaultRedactor
	}
	full, err := Canonical(args)
	if err != nil {
		e.ArgsSHA256, e.Args = "", "(arguments not encodable: "+Clip(err.Error(), 128)+")"
		return
	}
	sum := sha256.Sum256(full)
	e.ArgsSHA256, e.ArgsBytes = hex.EncodeToString(sum[:]), len(full)
	shown := full
	if red, changed := x.redact(map[string]any(args)); changed {
		if shown, err = Canonical(red.(map[string]any)); err != nil {
			e.Args = Redacted
			return
		}
	}
	// Patterns look at twice the preview, so a match that starts before
	// the cut is replaced before it is cut.
	window := string(shown[:min(len(shown), 2*PreviewBytes)])
	for _, p := range x.patterns {
		window = p.ReplaceAllString(window, Redacted)
	}
	e.Args = Clip(window, PreviewBytes)
	e.ArgsClipped = len(e.Args) < len(window) || len(shown) > 2*PreviewBytes
}
