// Package tooldocs turns MCP tool definitions into the documentation sandbox code
// reads (summaries, Python-like signatures, schemas) and ranks tools against a
// free-text query.
package tooldocs

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// Tool is one tool of one server.
type Tool struct {
	Server      string
	Name        string
	Description string
	InputSchema json.RawMessage
}

// Doc is what query_tool_docs and search_tool_docs return for a tool. It has
// mcpexec's keys and, for code written for the Python bridge
// (mcp-server-code-execution-mode), the bridge's: serverAlias, toolAlias (the
// bridge's aliases, see BridgeServerAliases and BridgeToolAliases),
// description (in both details, when not empty) and inputSchema.
type Doc struct {
	Server      string          `json:"server"`
	Tool        string          `json:"tool"`
	Alias       string          `json:"alias"`
	Summary     string          `json:"summary"`
	Signature   string          `json:"signature"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"` // full detail only
	Score       float64         `json:"score,omitempty"`        // search only

	ServerAlias  string          `json:"serverAlias"`
	ToolAlias    string          `json:"toolAlias"`
	BridgeSchema json.RawMessage `json:"inputSchema,omitempty"` // full detail only: InputSchema again
}

// Aliases maps each tool name to a unique Python identifier ("search-files" →
// "search_files"), in the order given.
func Aliases(names []string) map[string]string {
	out := make(map[string]string, len(names))
	used := map[string]bool{}
	for _, n := range names {
		out[n] = uniqueAlias(used, Identifier(n))
	}
	return out
}

// uniqueAlias is base, else the first of base_2, base_3... not in used; it
// marks what it returns used.
func uniqueAlias(used map[string]bool, base string) string {
	a := base
	for i := 2; used[a]; i++ {
		a = fmt.Sprintf("%s_%d", base, i)
	}
	used[a] = true
	return a
}

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9_]`)

var pyKeywords = map[string]bool{"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true,
	"async": true, "await": true, "break": true, "class": true, "continue": true, "def": true, "del": true,
	"elif": true, "else": true, "except": true, "finally": true, "for": true, "from": true, "global": true,
	"if": true, "import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true}

// Identifier turns a name into a Python identifier: other characters become
// '_', a leading digit gets a '_' prefix, keywords a '_' suffix.
func Identifier(name string) string {
	a := nonIdent.ReplaceAllString(name, "_")
	if a == "" || unicode.IsDigit(rune(a[0])) {
		a = "_" + a
	}
	if pyKeywords[a] {
		a += "_"
	}
	return a
}

// Document renders t: alias is its mcpexec alias, serverAlias and toolAlias
// the bridge's; full adds the input schema.
func Document(t Tool, alias, serverAlias, toolAlias string, full bool) Doc {
	d := Doc{Server: t.Server, Tool: t.Name, Alias: alias, Summary: Summary(t.Description),
		Signature: Signature(alias, t.InputSchema), Description: strings.TrimSpace(t.Description),
		ServerAlias: serverAlias, ToolAlias: toolAlias}
	if full && len(t.InputSchema) > 0 {
		d.InputSchema = t.InputSchema
		d.BridgeSchema = t.InputSchema
	}
	return d
}

// BridgeToolAlias is the alias the Python bridge (mcp-server-code-execution-mode,
// _sanitize_identifier) gives a tool: the name trimmed of white space, each run
// of characters other than ASCII letters, digits and '_' replaced by one '_',
// lower-cased; "tool" when empty; a leading digit gets a '_' prefix, a keyword
// a '_' suffix ("getUser" → "getuser", "read--file" → "read_file").
func BridgeToolAlias(name string) string {
	a := strings.ToLower(nonIdentRun.ReplaceAllString(strings.TrimFunc(name, pyIsSpace), "_"))
	if a == "" {
		a = "tool"
	}
	if a[0] >= '0' && a[0] <= '9' {
		a = "_" + a
	}
	if pyKeywords[a] {
		a += "_"
	}
	return a
}

// BridgeToolAliases maps each tool name of one server to its bridge alias, in
// the order the server lists them: the n-th tool with the same alias gets
// "_n" appended, as the bridge does (_ensure_server_metadata).
func BridgeToolAliases(names []string) map[string]string {
	out := make(map[string]string, len(names))
	count := map[string]int{}
	for _, n := range names {
		base := BridgeToolAlias(n)
		count[base]++
		if count[base] == 1 {
			out[n] = base
		} else {
			out[n] = fmt.Sprintf("%s_%d", base, count[base])
		}
	}
	return out
}

// BridgeServerAlias is the alias the Python bridge gives a server (MCPBridge.
// _alias_for, before de-duplication): the name lower-cased as Python does, each
// run of characters other than a-z, 0-9 and '_' replaced by one '_'; "server"
// when empty; a leading digit gets a '_' prefix ("GitHub" → "github").
func BridgeServerAlias(name string) string {
	var b strings.Builder
	for _, r := range name {
		if r == '\u0130' { // Python lower-cases İ to i and a combining dot
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	a := nonLowerIdentRun.ReplaceAllString(b.String(), "_")
	if a == "" {
		a = "server"
	}
	if a[0] >= '0' && a[0] <= '9' {
		a = "_" + a
	}
	return a
}

// BridgeServerAliases maps each server name to its bridge alias, de-duplicated
// ("_2", "_3"...) in sorted name order.
func BridgeServerAliases(names []string) map[string]string {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	out := make(map[string]string, len(sorted))
	used := map[string]bool{}
	for _, n := range sorted {
		if _, ok := out[n]; ok {
			continue
		}
		out[n] = uniqueAlias(used, BridgeServerAlias(n))
	}
	return out
}

var (
	nonIdentRun      = regexp.MustCompile(`[^0-9A-Za-z_]+`)
	nonLowerIdentRun = regexp.MustCompile(`[^a-z0-9_]+`)
)

// pyIsSpace is Python's str.isspace for one character (Go's unicode.IsSpace
// leaves out the separators U+001C..U+001F).
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// Summary is the first sentence (or line) of a description, at most 160 bytes.
func Summary(desc string) string {
	s := strings.TrimSpace(desc)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if len(s) > 160 {
		cut := 157
		for cut > 0 && !utf8Start(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

type schema struct {
	Type       any                        `json:"type"`
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
}

// Signature renders a Python-like call signature from an input schema:
// `echo(text: str, count: int = None)`.
func Signature(alias string, inputSchema json.RawMessage) string {
	var s schema
	_ = json.Unmarshal(inputSchema, &s) // a schema that does not parse documents no properties
	req := map[string]bool{}
	for _, r := range s.Required {
		req[r] = true
	}
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.SliceStable(names, func(i, j int) bool {
		if req[names[i]] != req[names[j]] {
			return req[names[i]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, 0, len(names))
	for _, n := range names {
		var p schema
		_ = json.Unmarshal(s.Properties[n], &p) // a schema that does not parse documents no properties
		part := n + ": " + pyType(p.Type)
		if !req[n] {
			part += " = None"
		}
		parts = append(parts, part)
	}
	return alias + "(" + strings.Join(parts, ", ") + ")"
}

func pyType(t any) string {
	switch v := t.(type) {
	case string:
		switch v {
		case "string":
			return "str"
		case "integer":
			return "int"
		case "number":
			return "float"
		case "boolean":
			return "bool"
		case "array":
			return "list"
		case "object":
			return "dict"
		case "null":
			return "None"
		}
	case []any:
		var out []string
		for _, x := range v {
			out = append(out, pyType(x))
		}
		return strings.Join(out, " | ")
	}
	return "Any"
}

// Index ranks tools against free-text queries with BM25 over weighted fields
// (tool name, server name, description, parameter names and descriptions),
// matching word stems and prefixes, so "find file" finds "search-files".
type Index struct {
	docs  []indexed
	df    map[string]int
	avgLn float64
}

type indexed struct {
	tool  Tool
	terms map[string]float64 // term -> weighted frequency
	ln    float64
}

// Field weights.
const (
	wName   = 3.0
	wServer = 1.5
	wDesc   = 1.0
	wParam  = 0.7
)

// NewIndex builds an index of tools.
func NewIndex(tools []Tool) *Index {
	ix := &Index{df: map[string]int{}}
	total := 0.0
	for _, t := range tools {
		d := indexed{tool: t, terms: map[string]float64{}}
		add := func(text string, w float64) {
			for _, tok := range Tokens(text) {
				d.terms[tok] += w
				d.ln += w
			}
		}
		add(t.Name, wName)
		add(t.Server, wServer)
		add(t.Description, wDesc)
		var s schema
		_ = json.Unmarshal(t.InputSchema, &s) // a schema that does not parse documents no properties
		for n, raw := range s.Properties {
			add(n, wParam)
			var p struct {
				Description string `json:"description"`
			}
			_ = json.Unmarshal(raw, &p) // a schema that does not parse documents no properties
			add(p.Description, wParam/2)
		}
		for term := range d.terms {
			ix.df[term]++
		}
		total += d.ln
		ix.docs = append(ix.docs, d)
	}
	if len(ix.docs) > 0 {
		ix.avgLn = total / float64(len(ix.docs))
	}
	return ix
}

// Hit is a tool and its score.
type Hit struct {
	Tool  Tool
	Score float64
}

// Search returns up to limit tools matching query, best first. Tools matching no
// query term are left out.
func (ix *Index) Search(query string, limit int) []Hit {
	q := Tokens(query)
	if len(q) == 0 || len(ix.docs) == 0 {
		return nil
	}
	const k1, b = 1.2, 0.75
	n := float64(len(ix.docs))
	var hits []Hit
	for _, d := range ix.docs {
		score := 0.0
		for _, qt := range q {
			tf, df := 0.0, 0
			if f, ok := d.terms[qt]; ok {
				tf, df = f, ix.df[qt]
			} else if len(qt) >= 3 {
				// A prefix either way ("calc" ~ "calculate", "files" ~ "file")
				// counts for half.
				for term, f := range d.terms {
					if len(term) >= 3 && (strings.HasPrefix(term, qt) || strings.HasPrefix(qt, term)) {
						if f/2 > tf {
							tf, df = f/2, ix.df[term]
						}
					}
				}
			}
			if tf == 0 {
				continue
			}
			idf := math.Log(1 + (n-float64(df)+0.5)/(float64(df)+0.5))
			score += idf * tf * (k1 + 1) / (tf + k1*(1-b+b*d.ln/ix.avgLn))
		}
		if score > 0 {
			hits = append(hits, Hit{Tool: d.tool, Score: math.Round(score*1000) / 1000})
		}
	}
	sort.SliceStable(hits, func(i, j int) bool {
		if hits[i].Score != hits[j].Score {
			return hits[i].Score > hits[j].Score
		}
		if hits[i].Tool.Server != hits[j].Tool.Server {
			return hits[i].Tool.Server < hits[j].Tool.Server
		}
		return hits[i].Tool.Name < hits[j].Tool.Name
	})
	if limit > 0 && len(hits) > limit {
		hits = hits[:limit]
	}
	return hits
}

var stop = map[string]bool{"the": true, "a": true, "an": true, "of": true, "to": true, "and": true, "or": true,
	"in": true, "on": true, "for": true, "with": true, "is": true, "it": true, "by": true, "from": true, "that": true,
	"this": true, "be": true, "as": true, "at": true, "its": true, "into": true, "given": true, "provided": true}

// Tokens splits text into lower-case stemmed words: on non-alphanumerics and
// camelCase boundaries, dropping stop words.
func Tokens(text string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, string(cur))
			cur = cur[:0]
		}
	}
	rs := []rune(text)
	for i, r := range rs {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if unicode.IsUpper(r) && len(cur) > 0 && i > 0 && (unicode.IsLower(rs[i-1]) ||
				(i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))) {
				flush()
			}
			cur = append(cur, unicode.ToLower(r))
		default:
			flush()
		}
	}
	flush()
	out := words[:0]
	for _, w := range words {
		if stop[w] {
			continue
		}
		out = append(out, Stem(w))
	}
	return out
}

// Stem strips common English suffixes so "files", "filing" and "file" meet.
func Stem(w string) string {
	for _, suf := range []string{"ing", "ies", "ed", "es", "s"} {
		if len(w) > len(suf)+2 && strings.HasSuffix(w, suf) {
			w = strings.TrimSuffix(w, suf)
			if suf == "ies" {
				w += "y"
			}
			if suf == "es" && !strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "x") && !strings.HasSuffix(w, "ch") && !strings.HasSuffix(w, "sh") {
				w += "e" // "files" -> "file", "boxes" -> "box"
			}
			break
		}
	}
	return w
}
