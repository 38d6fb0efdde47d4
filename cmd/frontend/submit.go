package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/submit"
)

// submitCmd is `frontend submit [flags] JOBS.jsonl`.
func submitCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("frontend submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := submit.Config{}
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:8080", "base URL of the front-end (its --http address)")
	fs.StringVar(&c.Token, "token", "", "bearer token, when the front-end requires one (env MCPEXEC_TOKEN)")
	fs.StringVar(&c.Out, "out", "-", "where to write the final job records as JSONL; - is stdout")
	fs.IntVar(&c.Batch, "batch", 500, "jobs per submission request")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "jobs waited for at once")
	fs.DurationVar(&c.Wait, "wait", 30*time.Second, "long-poll timeout of one wait request")
	fs.DurationVar(&c.Progress, "progress", time.Second, "how often progress is printed to stderr; 0 disables it")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: frontend submit [flags] JOBS.jsonl   (one job object per line: id, code, servers, timeout, max_attempts, labels, after, after_any; - reads stdin)")
		fs.PrintDefaults()
	}
	if err := cli.ParseArgs(fs, args, nil, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cli.Usagef("submit needs exactly one JSONL file of jobs (or - for stdin), got %d arguments", fs.NArg())
	}
	c.In = fs.Arg(0)
	if c.Token == "" {
		c.Token = os.Getenv("MCPEXEC_TOKEN")
	}
	return c.Run(ctx, stdin, stdout, stderr)
}
