package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
)

const auditUsage = `usage: broker audit verify [--data DIR | --file FILE] [--json]

Walks the audit trail of a broker's state file (DIR/state.db, or a backup
of it made with ` + "`broker backup`" + `) and checks every namespace's hash chain:
each entry's hash matches its content and the entry before it, no entry is
missing, and the chain's head is its last entry. It names the first entry
that does not fit and exits 1; 0 when every chain holds. The broker that
uses the file must be stopped (the file is opened read-only): verify a
backup of a running one.`

// auditCmd is `broker audit verify`.
func auditCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker audit verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data/broker", "the broker's data directory (its state.db is verified)")
	file := fs.String("file", "", "a state file to verify instead (e.g. a backup)")
	asJSON := fs.Bool("json", false, "print the chains as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, auditUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "verify" {
		fs.Usage()
		return cli.Usagef("broker audit: want `broker audit verify`")
	}
	if err := cli.Parse(fs, args[1:], nil); err != nil {
		return err
	}
	path := *file
	if path == "" {
		path = filepath.Join(*data, "state.db")
	}
	chains, err := boltstore.VerifyAudit(path)
	var broken *audit.BrokenError
	if err != nil && !errors.As(err, &broken) {
		return err
	}
	if *asJSON {
		out := struct {
			File   string                 `json:"file"`
			Chains []boltstore.AuditChain `json:"chains"`
			Broken *audit.BrokenError     `json:"broken,omitempty"`
		}{path, chains, broken}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		for _, c := range chains {
			fmt.Fprintf(stdout, "namespace %q: entries %d-%d hold, head %s\n", c.Namespace, c.First, c.Last, c.Head)
		}
	}
	if broken != nil {
		return fmt.Errorf("%s: %w", path, broken)
	}
	if len(chains) == 0 {
		fmt.Fprintf(stdout, "%s holds no audit entries\n", path)
	}
	return nil
}
