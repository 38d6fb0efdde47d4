// Command testserver is a tiny stdio MCP server for tests: it echoes, adds, returns
// big results, fails, sleeps, crashes, has a mixed-case tool (getUser), and
// changes its tool list on request.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	name := flag.String("name", "testserver", "server name reported at initialize")
	flag.Parse()
	if os.Getenv("TESTSERVER_EXIT_AT_START") != "" {
		fmt.Fprintln(os.Stderr, "testserver: refusing to start (TESTSERVER_EXIT_AT_START is set)")
		os.Exit(4)
	}
	s := server.NewMCPServer(*name, "1.0.0", server.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echo the provided message back unchanged."),
		mcp.WithString("text", mcp.Required(), mcp.Description("The message to echo."))),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(r.GetString("text", "")), nil
		})
	s.AddTool(mcp.NewTool("add", mcp.WithDescription("Add two numbers and return their sum as JSON."),
		mcp.WithNumber("a", mcp.Required()), mcp.WithNumber("b", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(fmt.Sprintf(`{"sum": %v}`, r.GetFloat("a", 0)+r.GetFloat("b", 0))), nil
		})
	s.AddTool(mcp.NewTool("big", mcp.WithDescription("Return a text result of the requested size in bytes."),
		mcp.WithNumber("bytes", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := r.GetInt("bytes", 0)
			return mcp.NewToolResultText(strings.Repeat("x", n)), nil
		})
	s.AddTool(mcp.NewTool("fail", mcp.WithDescription("Always fail with the given message (a tool error)."),
		mcp.WithString("message")),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError(r.GetString("message", "it failed")), nil
		})
	s.AddTool(mcp.NewTool("slow", mcp.WithDescription("Sleep for some seconds, then answer done."),
		mcp.WithNumber("seconds")),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			select {
			case <-time.After(time.Duration(r.GetFloat("seconds", 1) * float64(time.Second))):
				return mcp.NewToolResultText("done"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	s.AddTool(mcp.NewTool("getUser", mcp.WithDescription("Get a user's profile by login. Answers JSON."),
		mcp.WithString("login", mcp.Required(), mcp.Description("The user's login."))),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			login := r.GetString("login", "")
			return mcp.NewToolResultText(fmt.Sprintf(`{"login": %q, "name": "User %s"}`, login, login)), nil
		})
	s.AddTool(mcp.NewTool("crash", mcp.WithDescription("Exit the server process immediately (simulates a crash).")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			fmt.Fprintln(os.Stderr, "testserver: crashing on request")
			os.Exit(3)
			return nil, nil
		})
	s.AddTool(mcp.NewTool("pid", mcp.WithDescription("Return the server's process id.")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(fmt.Sprint(os.Getpid())), nil
		})
	s.AddTool(mcp.NewTool("search-files", mcp.WithDescription("Find files on disk whose names match a pattern, recursively."),
		mcp.WithString("pattern", mcp.Required(), mcp.Description("Glob pattern of file names."))),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(`["a.txt", "b.txt"]`), nil
		})
	s.AddTool(mcp.NewTool("add_tool", mcp.WithDescription("Register a new tool named by the argument (changes the tool list)."),
		mcp.WithString("name", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := r.GetString("name", "later")
			s.AddTool(mcp.NewTool(n, mcp.WithDescription("A tool added at run time.")),
				func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return mcp.NewToolResultText("late " + n), nil
				})
			return mcp.NewToolResultText("added " + n), nil
		})
	fmt.Fprintln(os.Stderr, "testserver: ready")
	if err := server.ServeStdio(s); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		os.Exit(1)
	}
}
