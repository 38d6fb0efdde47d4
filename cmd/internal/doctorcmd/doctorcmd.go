// Package doctorcmd is the `doctor` subcommand of `worker` and `frontend`: it
// parses the same NATS and sandbox flags (and environment variables) as the
// binary it belongs to and runs package doctor's checks.
package doctorcmd

import (
	"context"
	"flag"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/cmd/internal/natsflags"
	"github.com/mcpexec/mcpexec/cmd/internal/sandboxflags"
	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/doctor"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// Main runs `<role> doctor [flags]`; role is "worker" or "frontend". The report
// goes to stdout; the error (doctor.ErrFailed when a check failed) makes the
// process exit non-zero.
func Main(ctx context.Context, role string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(role+" doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defNATS := nats.DefaultURL
	natsHelp := "NATS URL(s) of the broker, comma-separated"
	if role == "frontend" {
		defNATS = ""
		natsHelp = "NATS URL(s) of a broker fleet; absent: check the embedded mode (sandbox only)"
	}
	natsURL := fs.String("nats", defNATS, natsHelp)
	timeout := fs.Duration("doctor-timeout", 3*time.Minute, "give up on the checks after this long")
	sb := sandboxflags.Register(fs)
	nf := natsflags.Register(fs)
	var syncPolicy broker.SyncPolicy
	var issuers issuerList
	if role == "frontend" {
		fs.Var(&syncPolicy, "sync", "embedded mode: "+broker.SyncUsage)
		fs.Var(&issuers, "oauth-issuer", "OAuth issuer URL the front-end trusts: check its metadata and keys; repeatable")
	}
	if err := cli.Parse(fs, args, sandboxflags.Aliases); err != nil {
		return err
	}
	if err := nf.Validate(); err != nil {
		return err
	}
	auth, err := nf.Auth()
	if err != nil {
		return err
	}
	limits, err := sb.Limits()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	cfg := doctor.Config{NATSURL: *natsURL, NATSOpts: auth, Queue: queue.DefaultConfig(), OAuthIssuers: issuers}
	choice := sb.Choose(ctx)
	box := &doctor.Sandbox{Engine: choice.Runtime, Address: choice.DockerHost, Config: sb.PoolConfig("", limits, nil),
		Open: func(ctx context.Context, cfg containerpool.Config) (doctor.Runtime, error) {
			return sb.OpenChoice(ctx, choice, cfg)
		}}
	switch {
	case role == "worker":
		cfg.Sandbox, cfg.RuntimeReason = box, choice.Reason
	case *natsURL == "":
		cfg.Sandbox, cfg.RuntimeReason = box, choice.Reason
		cfg.SkipNATSReason = "embedded mode (no --nats): the front-end starts its own broker"
		cfg.EmbeddedSync = syncPolicy.String()
	default:
		cfg.ExpectWorkers = true
		cfg.SkipSandboxReason = "a front-end of a fleet runs no sandboxes: run `worker doctor` on the worker hosts"
	}
	return doctor.Report(stdout, "mcpexec "+role+" doctor", doctor.Run(ctx, cfg))
}

// issuerList is a repeatable flag of URLs (commas separate several).
type issuerList []string

func (l *issuerList) String() string { return strings.Join(*l, ",") }

func (l *issuerList) Set(v string) error {
	for _, u := range strings.Split(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			*l = append(*l, u)
		}
	}
	return nil
}
