// Package cli holds what the three mains share: flags that also read environment
// variables, exit codes, and logger construction.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes of every binary.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// UsageError marks a bad flag or config: the process exits with ExitUsage.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// EnvName is the environment variable read for a flag: MCPEXEC_ and the flag name
// upper-cased with '-' as '_'.
func EnvName(flagName string) string {
	return "MCPEXEC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse sets each flag of fs from its environment variable (or one of its aliases,
// such as the seed's MCP_BRIDGE_* names), then parses args, so flags win.
func Parse(fs *flag.FlagSet, args []string, aliases map[string][]string) error {
	return ParseArgs(fs, args, aliases, 0)
}

// ParseArgs is Parse for a command that takes up to maxArgs positional
// arguments after its flags (fs.Args()); more are refused.
func ParseArgs(fs *flag.FlagSet, args []string, aliases map[string][]string, maxArgs int) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		names := append([]string{EnvName(f.Name)}, aliases[f.Name]...)
		for _, n := range names {
			if v, ok := os.LookupEnv(n); ok {
				if serr := fs.Set(f.Name, v); serr != nil && err == nil {
					err = &UsageError{Err: fmt.Errorf("environment %s=%q: %w", n, v, serr)}
				}
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if perr := fs.Parse(args); perr != nil {
		if errors.Is(perr, flag.ErrHelp) {
			return perr
		}
		return &UsageError{Err: perr}
	}
	if fs.NArg() > maxArgs {
		fs.Usage()
		if maxArgs == 0 {
			return &UsageError{Err: fmt.Errorf("unexpected argument %q: %s takes only flags (see the usage above)", fs.Arg(0), fs.Name())}
		}
		return &UsageError{Err: fmt.Errorf("unexpected argument %q: %s takes at most %d arguments after its flags (see the usage above)", fs.Arg(maxArgs), fs.Name(), maxArgs)}
	}
	return nil
}

// ExitCode maps an error from Run to the process exit code.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	default:
		return ExitFailure
	}
}

// Logger returns a JSON logger writing to w at the named level.
func Logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, Usagef("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// Main is the body of every main: it runs run with a context cancelled on SIGINT
// or SIGTERM, prints its error as "name: error", and exits with ExitCode.
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	os.Exit(ExitCode(err))
}

// IsLoopback reports whether a listen address (HOST:PORT) binds only
// loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Truthy reports whether an environment value means yes (1, true, yes, on),
// as the seed bridge reads its switches.
func Truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}
