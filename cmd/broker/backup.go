package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/mcpexec/mcpexec/cmd/internal/natsflags"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// backupCmd is `broker backup [--nats URL] [--node NAME] FILE`: one broker node
// writes a consistent snapshot of its state file to FILE (on that node's host)
// while it serves.
func backupCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("nats", "nats://127.0.0.1:4222", "NATS URL of the cluster (an admin or broker identity when it is secured)")
	node := fs.String("node", state.AnyNode, "server name of the broker node to back up ("+state.AnyNode+": any one node)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the snapshot")
	nf := natsflags.Register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: broker backup [--nats URL] [--node NAME] FILE\n\nA broker node writes a consistent snapshot of its state file (job records, memory) to FILE\non its own host, while it serves. FILE must not exist. Restore: stop the node, put FILE in\nplace of DATA/state.db, start it (it folds what the streams hold since the snapshot).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return &cli.UsageError{Err: err}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cli.Usagef("broker backup: want exactly one FILE, got %d arguments", fs.NArg())
	}
	if err := nf.Validate(); err != nil {
		return err
	}
	path, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		return cli.Usagef("broker backup: %v", err)
	}
	nc, err := nf.Connect(*url, "mcpexec-backup", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	req, _ := json.Marshal(state.BackupRequest{Path: path}) // plain fields always encode
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, jobs.Subjects{}.AdminBackup(*node), req)
	if err != nil {
		return fmt.Errorf("ask node %q for a backup: %w (is it running with the state service, and is --node its server name?)", *node, err)
	}
	var reply state.BackupReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("decode the backup answer: %w", err)
	}
	if reply.Error != "" {
		return fmt.Errorf("node %q: %s", *node, reply.Error)
	}
	fmt.Fprintf(stdout, "wrote %s (%d bytes) on node %s\n", path, reply.Bytes, reply.Node)
	return nil
}
