package proxyresp

import (
	"context"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/toolrules"
)

// toolList is a ToolSource of one server's tools, as the pool's cache
// answers them.
type toolList []mcp.Tool

func (l toolList) Servers() []discovery.Server { return nil }
func (l toolList) Tools(context.Context, string) ([]mcp.Tool, error) {
	return l, nil
}
func (l toolList) CallTool(context.Context, string, string, map[string]any) (*mcp.CallToolResult, error) {
	return nil, nil
}

// BenchmarkAuthorize: the responder's own cost of deciding an allowed call
// (what the rules add to every proxied call, beside the end-to-end
// BenchmarkToolRules): no rules, a matching glob among others, and no
// matching rule (the tool's annotations, from the pool's cached list of 30
// tools).
func BenchmarkAuthorize(b *testing.B) {
	tools := toolList{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "aa", "bb", "cc"} {
		tools = append(tools, mcp.NewTool(n))
	}
	tools = append(tools, mcp.NewTool("echo", mcp.WithReadOnlyHintAnnotation(true)))
	rule, _ := toolrules.Compile(map[string]string{"ts/delete_*": "deny", "ts/ec*": "allow", "*/*": "ask", "other/*": "deny", "ts/add": "ask"}, nil)
	annotations, _ := toolrules.Compile(map[string]string{"ts/delete_*": "deny", "ts/add": "ask"}, nil)
	rj := &runningJob{job: jobs.Job{ID: "j", Namespace: "ns"}}
	args := map[string]any{"text": "x"}
	for _, c := range []struct {
		name  string
		rules *toolrules.Rules
	}{{"none", nil}, {"rule", rule}, {"annotations", annotations}} {
		b.Run(c.name, func(b *testing.B) {
			r := &Responder{cfg: Config{Tools: tools, Policy: func(string) Policy { return Policy{Tools: c.rules} }}}
			ctx := context.Background()
			for range b.N {
				if _, err := r.authorize(ctx, rj, "ts", "echo", args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
