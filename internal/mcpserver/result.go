package mcpserver

import (
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Structured is run_python's structuredContent.
type Structured = jobs.Structured

// resultOf renders a terminal record as the tool result: the compact text form
// plus structuredContent.
func resultOf(rec *jobs.Record, mode string) *mcp.CallToolResult {
	res := rec.Result
	if res == nil {
		res = &jobs.Result{Status: rec.Status}
	}
	st := rec.Structured()
	var b strings.Builder
	b.WriteString(strings.TrimRight(res.Stdout, "\n"))
	if res.StdoutTruncated {
		b.WriteString("\n[stdout truncated]")
	}
	if res.Stderr != "" {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("stderr:\n")
		b.WriteString(strings.TrimRight(res.Stderr, "\n"))
		if res.StderrTruncated {
			b.WriteString("\n[stderr truncated]")
		}
	}
	if res.Status != jobs.StatusSuccess {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "status: %s", res.Status)
		if res.Error != "" {
			fmt.Fprintf(&b, "\nerror: %s", res.Error)
		}
	}
	if len(st.Files) > 0 || len(st.Notes) > 0 {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		writeFiles(&b, st)
	}
	if b.Len() == 0 {
		b.WriteString("(no output)")
	}
	text := b.String()
	if mode == OutputTOON {
		text = TOON(st)
	}
	out := mcp.NewToolResultStructured(st, text)
	out.IsError = res.Status != jobs.StatusSuccess
	return out
}
