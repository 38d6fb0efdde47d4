package mcpserver

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// maxToolListBytes bounds tools/list with both languages: every agent pays
// these bytes of context before its first question, on every connection.
const maxToolListBytes = 1600

// TestToolListIsSmall: tools/list with both languages stays within
// maxToolListBytes (as JSON, servers enum empty) and comes in the same
// order every time.
func TestToolListIsSmall(t *testing.T) {
	ctx := context.Background()
	cl := inProcess(t, &echoRunner{}, Options{Languages: jobs.Languages})
	var first []string
	for range 3 {
		list, err := cl.ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(list)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxToolListBytes {
			t.Fatalf("tools/list is %d bytes, over %d:\n%s", len(b), maxToolListBytes, b)
		}
		var names []string
		for _, tl := range list.Tools {
			names = append(names, tl.Name)
		}
		if first == nil {
			first = names
			t.Logf("tools/list: %d bytes", len(b))
		} else if !slices.Equal(names, first) {
			t.Fatalf("tools/list order changed: %v, then %v", first, names)
		}
	}
}
