package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestBackupWhileServing: `broker backup FILE` makes a running node write a
// snapshot that opens as a state file holding what was written before it.
func TestBackupWhileServing(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	nc := testutil.Connect(t, b, "test")
	sc := state.NewClient(nc, jobs.Subjects{})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := sc.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: k, Value: json.RawMessage(`"v-` + k + `"`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "state.bak")
	var out, errb bytes.Buffer
	if err := backupCmd(ctx, []string{"--nats", b.ClientURL(), file}, &out, &errb); err != nil {
		t.Fatalf("backup: %v (%s)", err, errb.String())
	}
	if !strings.Contains(out.String(), "wrote "+file) {
		t.Fatalf("output %q", out.String())
	}
	st, err := boltstore.Open(file)
	if err != nil {
		t.Fatalf("open the backup: %v", err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	for _, k := range []string{"a", "b", "c"} {
		m, err := st.MemoryGet("ns", k)
		if err != nil || string(m.Value) != `"v-`+k+`"` {
			t.Fatalf("backup's %s: %v %v", k, m, err)
		}
	}
	// The file exists now: a second backup to it is refused, saying why.
	err = backupCmd(ctx, []string{"--nats", b.ClientURL(), file}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("backup over an existing file: %v", err)
	}
	// No file, or an unknown node, is a clear error.
	if err := backupCmd(ctx, nil, &out, &errb); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("no FILE: %v", err)
	}
	err = backupCmd(ctx, []string{"--nats", b.ClientURL(), "--node", "nope", "--timeout", "1s", file + "2"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown node: %v", err)
	}
}
