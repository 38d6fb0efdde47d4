package mcpserver

import (
	"regexp"
	"strconv"
	"strings"
)

// TOON renders a structured result in TOON (Token-Oriented Object Notation):
// `key: value` lines, arrays of strings inline as `key[N]: a,b`, strings quoted
// only when they would otherwise be ambiguous.
func TOON(s Structured) string {
	var b strings.Builder
	field := func(k, v string) {
		b.WriteString(k)
		b.WriteString(": ")
		b.WriteString(v)
		b.WriteByte('\n')
	}
	list := func(k string, vs []string) {
		b.WriteString(k)
		b.WriteString("[")
		b.WriteString(strconv.Itoa(len(vs)))
		b.WriteString("]:")
		for i, v := range vs {
			if i == 0 {
				b.WriteByte(' ')
			} else {
				b.WriteByte(',')
			}
			b.WriteString(toonString(v))
		}
		b.WriteByte('\n')
	}
	field("status", toonString(s.Status))
	field("summary", toonString(s.Summary))
	field("exitCode", strconv.Itoa(s.ExitCode))
	list("stdout", s.Stdout)
	list("stderr", s.Stderr)
	if s.Error != "" {
		field("error", toonString(s.Error))
	}
	field("timeoutSeconds", strconv.Itoa(s.TimeoutSeconds))
	field("jobId", toonString(s.JobID))
	return strings.TrimRight(b.String(), "\n")
}

// toonString quotes s when TOON needs it: empty, padded, a literal (true, false,
// null, a number), or containing the delimiter or structural characters.
func toonString(s string) string {
	if s == "" || strings.TrimSpace(s) != s || s == "true" || s == "false" || s == "null" ||
		strings.HasPrefix(s, "- ") || s == "-" || looksNumeric(s) || strings.ContainsAny(s, ",:\"\\[]{}#\n\r\t") {
		var b strings.Builder
		b.WriteByte('"')
		for _, r := range s {
			switch r {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			default:
				if r < 0x20 {
					b.WriteString(`\u00`)
					b.WriteString(strconv.FormatInt(int64(r)>>4, 16))
					b.WriteString(strconv.FormatInt(int64(r)&15, 16))
				} else {
					b.WriteRune(r)
				}
			}
		}
		b.WriteByte('"')
		return b.String()
	}
	return s
}

var numeric = regexp.MustCompile(`^-?\d+(\.\d+)?([eE][+-]?\d+)?$`)

// looksNumeric reports whether a reader would take s for a number (including
// ones with leading zeros, such as "007").
func looksNumeric(s string) bool { return numeric.MatchString(s) }
