// Package discovery finds the MCP servers a front-end proxies: from files named on
// the command line, from MCP_SERVERS_CONFIG, and from the usual client config
// locations (Claude Desktop, Claude Code, Cursor, VS Code, ~/.config/mcp/servers,
// ./mcp-servers). It also holds the allow/deny policy applied to them.
//
// Every search root is given by the caller, so tests never read the real home
// directory.
package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Server is one MCP server definition: a command to launch (stdio), or the URL of
// a remote server (streamable HTTP, or SSE when Type is "sse").
type Server struct {
	Name        string            `json:"name"`
	Command     string            `json:"command,omitempty"`
	Args        []string          `json:"args,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Cwd         string            `json:"cwd,omitempty"`
	Description string            `json:"description,omitempty"`
	URL         string            `json:"url,omitempty"`
	Type        string            `json:"type,omitempty"` // "stdio", "http", "sse"; inferred when empty
	Headers     map[string]string `json:"headers,omitempty"`
	// Source is the file the definition came from.
	Source string `json:"source,omitempty"`
	// Catalog marks a server of the operator's catalog: known but not
	// enabled. A namespace's code may enable it (enable_server); until then
	// it is in no servers list.
	Catalog bool `json:"catalog,omitempty"`
}

// Remote reports whether s is reached over HTTP rather than launched.
func (s Server) Remote() bool { return s.URL != "" }

// CatalogEntry is a catalog server as find_servers and enable_server answer
// it.
type CatalogEntry struct {
	Name        string `json:"name"`
	Alias       string `json:"alias"` // mcp_<alias> in the sandbox
	Description string `json:"description"`
	Transport   string `json:"transport,omitempty"`
	// Enabled: the caller's namespace has it enabled.
	Enabled bool `json:"enabled"`
	// Score ranks find_servers' answers (absent when it lists all).
	Score float64 `json:"score,omitempty"`
	// AlreadyEnabled (enable_server): it was enabled before this call.
	AlreadyEnabled bool `json:"already_enabled,omitempty"`
}

// Problem is a config file that could not be used, and why. Problems never stop
// discovery: the other files are still read.
type Problem struct {
	Source string
	Err    error
}

func (p Problem) Error() string { return fmt.Sprintf("%s: %v", p.Source, p.Err) }

// Skip is a server definition left out on purpose.
type Skip struct {
	Name, Source, Reason string
}

// Result is what Discover found.
type Result struct {
	Servers  []Server // in priority order; names are unique
	Problems []Problem
	Skipped  []Skip
}

// Options say where to look. Empty fields disable their locations.
type Options struct {
	// Files are --servers files, read first and in order. A missing file is a
	// problem.
	Files []string
	// EnvConfig is MCP_SERVERS_CONFIG: one or more paths separated by the OS list
	// separator. A missing file is a problem.
	EnvConfig string
	// Home is the user's home directory; "" skips every home location.
	Home string
	// ConfigHome is $XDG_CONFIG_HOME; "" means Home/.config.
	ConfigHome string
	// Cwd is the working directory whose project files are read; "" skips them.
	Cwd string
	// Self names the running executable; entries that would launch it (or any
	// mcpexec) are skipped.
	Self string
	// Policy filters the servers found.
	Policy Policy
	// LookupEnv expands ${VAR} in commands, args, env values, URLs and headers;
	// nil leaves them as written.
	LookupEnv func(string) (string, bool)
	// AllowSelf keeps entries that launch mcpexec itself
	// (MCP_BRIDGE_ALLOW_SELF_SERVER); they are skipped otherwise.
	AllowSelf bool
	// Catalog are the operator's catalog files (--catalog): servers in the
	// same mcpServers form, known but enabled only per namespace. They are
	// read last; a name configured elsewhere is not a catalog server.
	Catalog []string
}

// Location is one place a config may be found.
type Location struct {
	Path     string
	Glob     bool // Path is a glob of files
	Explicit bool // named by the operator: a missing file is a problem
	// Project is the key of ~/.claude.json's "projects" whose servers apply too.
	Project string
	// Catalog: the servers found here are catalog servers.
	Catalog bool
}

// Locations returns where Discover looks, highest priority first.
func Locations(o Options) []Location {
	var locs []Location
	for _, f := range o.Files {
		locs = append(locs, Location{Path: f, Explicit: true})
	}
	for _, f := range filepath.SplitList(o.EnvConfig) {
		if f = strings.TrimSpace(f); f != "" {
			locs = append(locs, Location{Path: f, Explicit: true})
		}
	}
	if o.Home != "" {
		// The seed bridge's directory: one or more {"mcpServers": ...} files.
		locs = append(locs, Location{Path: filepath.Join(o.Home, "MCPs", "*.json"), Glob: true})
	}
	if o.Cwd != "" {
		locs = append(locs,
			Location{Path: filepath.Join(o.Cwd, ".mcp.json")},           // Claude Code project
			Location{Path: filepath.Join(o.Cwd, ".cursor", "mcp.json")}, // Cursor project
			Location{Path: filepath.Join(o.Cwd, ".vscode", "mcp.json")}, // VS Code workspace
			Location{Path: filepath.Join(o.Cwd, "mcp-servers", "*.json"), Glob: true},
		)
	}
	if o.Home != "" {
		cfg := o.ConfigHome
		if cfg == "" {
			cfg = filepath.Join(o.Home, ".config")
		}
		locs = append(locs,
			Location{Path: filepath.Join(o.Home, ".claude.json"), Project: o.Cwd},                                             // Claude Code
			Location{Path: filepath.Join(o.Home, "Library", "Application Support", "Claude Code", "claude_code_config.json")}, // Claude Code (macOS)
			Location{Path: filepath.Join(o.Home, "Library", "Application Support", "Claude", "claude_desktop_config.json")},   // Claude Desktop (macOS)
			Location{Path: filepath.Join(cfg, "Claude", "claude_desktop_config.json")},                                        // Claude Desktop (Linux)
			Location{Path: filepath.Join(o.Home, ".cursor", "mcp.json")},                                                      // Cursor
			Location{Path: filepath.Join(cfg, "Code", "User", "mcp.json")},                                                    // VS Code (Linux)
			Location{Path: filepath.Join(o.Home, "Library", "Application Support", "Code", "User", "mcp.json")},               // VS Code (macOS)
			Location{Path: filepath.Join(cfg, "mcp", "servers", "*.json"), Glob: true},                                        // shared
		)
	}
	for _, f := range o.Catalog {
		locs = append(locs, Location{Path: f, Explicit: true, Catalog: true})
	}
	return locs
}

// files are the files loc names: its path, or what its glob matches, sorted.
func (loc Location) files() ([]string, error) {
	if !loc.Glob {
		return []string{loc.Path}, nil
	}
	m, err := filepath.Glob(loc.Path)
	if err != nil {
		return nil, err
	}
	sort.Strings(m)
	return m, nil
}

// Discover reads every location and returns the servers found. The first
// definition of a name wins.
func Discover(o Options) Result {
	var res Result
	seen := map[string]bool{}
	for _, loc := range Locations(o) {
		files, err := loc.files()
		if err != nil {
			res.Problems = append(res.Problems, Problem{Source: loc.Path, Err: err})
			continue
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) && !loc.Explicit {
					continue
				}
				res.Problems = append(res.Problems, Problem{Source: f, Err: fmt.Errorf("cannot read it: %w", err)})
				continue
			}
			servers, problems := Parse(data, f, loc.Project)
			res.Problems = append(res.Problems, problems...)
			for _, s := range servers {
				if seen[s.Name] {
					if loc.Catalog {
						res.Skipped = append(res.Skipped, Skip{Name: s.Name, Source: f, Reason: "defined earlier (configured, or in an earlier catalog file), so this catalog entry is not used"})
					}
					continue
				}
				s.Catalog = loc.Catalog
				if o.LookupEnv != nil {
					s = expand(s, o.LookupEnv)
				}
				if why := launchesSelf(s, o.Self); why != "" && !o.AllowSelf {
					res.Skipped = append(res.Skipped, Skip{Name: s.Name, Source: f, Reason: why})
					seen[s.Name] = true
					continue
				}
				if !o.Policy.Allowed(s.Name) {
					res.Skipped = append(res.Skipped, Skip{Name: s.Name, Source: f, Reason: "denied by the allow/deny policy"})
					seen[s.Name] = true
					continue
				}
				seen[s.Name] = true
				res.Servers = append(res.Servers, s)
			}
		}
	}
	return res
}

// Fingerprint sums up the files Discover would read (their paths, sizes and
// modification times, globs expanded): it changes when a config is added,
// changed or removed, so a watcher rereads them only then.
func Fingerprint(o Options) string {
	var b strings.Builder
	for _, loc := range Locations(o) {
		files, err := loc.files()
		if err != nil {
			continue
		}
		for _, f := range files {
			st, err := os.Stat(f)
			if err != nil {
				fmt.Fprintf(&b, "%s:-\n", f)
				continue
			}
			fmt.Fprintf(&b, "%s:%d:%d\n", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	return b.String()
}

// entry is one server as written in a config file.
type entry struct {
	Command     string            `json:"command"`
	Args        []string          `json:"args"`
	Env         map[string]string `json:"env"`
	Cwd         string            `json:"cwd"`
	Description string            `json:"description"`
	URL         string            `json:"url"`
	ServerURL   string            `json:"serverUrl"` // Windsurf's spelling
	Type        string            `json:"type"`
	Transport   string            `json:"transport"`
	Headers     map[string]string `json:"headers"`
	Disabled    bool              `json:"disabled"`
}

// NamePattern is what a server name may look like: it becomes a Python alias, a
// module name and an enum value.
var NamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Parse reads one config file: {"mcpServers": {...}} (Claude, Cursor and most
// clients) or {"servers": {...}} (VS Code). project, when set, also takes the
// servers of ~/.claude.json's projects[project]. Bad entries are problems; the
// good ones are still returned.
func Parse(data []byte, source, project string) ([]Server, []Problem) {
	var doc struct {
		MCPServers json.RawMessage `json:"mcpServers"`
		Servers    json.RawMessage `json:"servers"`
		// Description is the file's: the description of its servers that
		// have none of their own (as the seed bridge reads ~/MCPs files).
		Description string `json:"description"`
		Projects    map[string]struct {
			MCPServers json.RawMessage `json:"mcpServers"`
		} `json:"projects"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, []Problem{{Source: source, Err: fmt.Errorf("not valid JSON: %w", err)}}
	}
	var out []Server
	var problems []Problem
	blocks := []json.RawMessage{doc.MCPServers, doc.Servers}
	if project != "" {
		if p, ok := doc.Projects[project]; ok {
			blocks = append(blocks, p.MCPServers)
		}
	}
	found := false
	for _, b := range blocks {
		if len(b) == 0 || string(b) == "null" {
			continue
		}
		found = true
		s, p := parseBlock(b, source)
		for i := range s {
			if s[i].Description == "" {
				s[i].Description = doc.Description
			}
		}
		out = append(out, s...)
		problems = append(problems, p...)
	}
	if !found && len(doc.Projects) == 0 {
		problems = append(problems, Problem{Source: source, Err: errors.New(`no "mcpServers" (or VS Code "servers") object: want {"mcpServers": {"name": {"command": ..., "args": [...]}}}`)})
	}
	return out, problems
}

func parseBlock(b json.RawMessage, source string) ([]Server, []Problem) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, []Problem{{Source: source, Err: fmt.Errorf(`"mcpServers" is not an object of servers: %w`, err)}}
	}
	names := make([]string, 0, len(raw))
	for n := range raw {
		names = append(names, n)
	}
	sort.Strings(names) // JSON objects are unordered; keep results stable
	var out []Server
	var problems []Problem
	for _, name := range names {
		var e entry
		if err := json.Unmarshal(raw[name], &e); err != nil {
			problems = append(problems, Problem{Source: source, Err: fmt.Errorf("server %q: %w", name, err)})
			continue
		}
		if e.Disabled {
			continue
		}
		s, err := e.server(name)
		if err != nil {
			problems = append(problems, Problem{Source: source, Err: fmt.Errorf("server %q: %w", name, err)})
			continue
		}
		s.Source = source
		out = append(out, s)
	}
	return out, problems
}

func (e entry) server(name string) (Server, error) {
	if !NamePattern.MatchString(name) {
		return Server{}, errors.New("name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	if e.URL == "" {
		e.URL = e.ServerURL
	}
	typ := strings.ToLower(e.Type)
	if typ == "" {
		typ = strings.ToLower(e.Transport)
	}
	switch typ {
	case "streamable-http", "streamablehttp", "streamable_http":
		typ = "http"
	}
	s := Server{Name: name, Command: e.Command, Args: e.Args, Env: e.Env, Cwd: e.Cwd,
		Description: e.Description, URL: e.URL, Headers: e.Headers}
	switch {
	case e.Command != "" && e.URL != "":
		return Server{}, errors.New(`give either "command" (a local server) or "url" (a remote one), not both`)
	case e.Command != "":
		if typ != "" && typ != "stdio" {
			return Server{}, fmt.Errorf(`type %q needs a "url", but the entry has a "command"`, e.Type)
		}
		s.Type = "stdio"
	case e.URL != "":
		if !strings.HasPrefix(e.URL, "http://") && !strings.HasPrefix(e.URL, "https://") {
			return Server{}, fmt.Errorf("url %q must start with http:// or https://", e.URL)
		}
		switch typ {
		case "", "http":
			s.Type = "http"
		case "sse":
			s.Type = "sse"
		default:
			return Server{}, fmt.Errorf(`type %q of a remote server: want "http" or "sse"`, e.Type)
		}
	default:
		return Server{}, errors.New(`needs "command" (and "args") to launch it, or "url" of a remote server`)
	}
	return s, nil
}

func expand(s Server, lookup func(string) (string, bool)) Server {
	ex := func(v string) string {
		return os.Expand(v, func(k string) string {
			name, fallback, hasDefault := strings.Cut(k, ":-")
			if val, ok := lookup(name); ok && val != "" {
				return val
			}
			if hasDefault {
				return fallback
			}
			return ""
		})
	}
	s.Command, s.URL, s.Cwd = ex(s.Command), ex(s.URL), ex(s.Cwd)
	args := make([]string, len(s.Args))
	for i, a := range s.Args {
		args[i] = ex(a)
	}
	s.Args = args
	s.Env = expandMap(s.Env, ex)
	s.Headers = expandMap(s.Headers, ex)
	return s
}

func expandMap(m map[string]string, ex func(string) string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = ex(v)
	}
	return out
}

// launchesSelf says why s would start mcpexec itself (a loop), or "".
func launchesSelf(s Server, self string) string {
	if s.Command == "" {
		return ""
	}
	if self != "" {
		if p, err := resolve(s.Command, s.Cwd); err == nil && sameFile(p, self) {
			return "it launches this mcpexec binary (" + self + ")"
		}
	}
	for _, word := range append([]string{s.Command}, s.Args...) {
		w := filepath.ToSlash(word)
		base := path.Base(w)
		if base == "mcpexec" || strings.HasPrefix(base, "mcpexec-") || strings.HasPrefix(base, "mcpexec@") ||
			strings.Contains(w, "mcpexec/cmd/frontend") {
			return fmt.Sprintf("it launches mcpexec (%q): a front-end must not proxy itself", word)
		}
	}
	return ""
}

func resolve(cmd, cwd string) (string, error) {
	if strings.ContainsRune(cmd, filepath.Separator) {
		if !filepath.IsAbs(cmd) && cwd != "" {
			cmd = filepath.Join(cwd, cmd)
		}
		return cmd, nil
	}
	return lookPath(cmd)
}

func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false
	}
	return os.SameFile(sa, sb)
}
