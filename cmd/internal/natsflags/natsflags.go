// Package natsflags holds the NATS client flags shared by `broker`, `worker` and
// `frontend`: credentials (user/password, NKey seed file or credentials file) and
// TLS (CA, client certificate and key), and the reconnect behaviour every process
// of a fleet needs to ride through the loss of a broker node.
//
// The credentials stay in the process that parsed them: nothing here reaches a
// sandbox (the runner is started with an empty environment of its own).
package natsflags

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/natsauth"
)

// Reconnect behaviour of every client connection. It is explicit rather than
// nats.go's defaults: a fleet process never gives up on the broker (a cluster
// node may be replaced), and notices a silent peer within half a minute.
const (
	ReconnectWait       = 500 * time.Millisecond
	ReconnectJitter     = 250 * time.Millisecond
	ReconnectJitterTLS  = time.Second
	ConnectTimeout      = 5 * time.Second
	PingInterval        = 10 * time.Second
	MaxPingsOutstanding = 3
)

// Flags are the NATS client settings.
type Flags struct {
	User     string
	Password string
	NKeyFile string // NKey seed file
	CredFile string // JWT credentials file
	CAFile   string // CA that signs the server's certificate
	CertFile string // client certificate (mutual TLS)
	KeyFile  string // key of CertFile
}

// Register defines the flags on fs (each also reads MCPEXEC_<NAME>, see cli.Parse).
func Register(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.User, "nats-user", "", "NATS user name (with --nats-password)")
	fs.StringVar(&f.Password, "nats-password", "", "NATS password (prefer MCPEXEC_NATS_PASSWORD to keep it out of ps)")
	fs.StringVar(&f.NKeyFile, "nats-nkey", "", "NATS NKey seed file to authenticate with")
	fs.StringVar(&f.CredFile, "nats-creds", "", "NATS credentials file (JWT and seed) to authenticate with")
	fs.StringVar(&f.CAFile, "nats-ca", "", "CA certificate file that signs the NATS server's certificate (enables TLS)")
	fs.StringVar(&f.CertFile, "nats-cert", "", "client certificate file for NATS mutual TLS (with --nats-key)")
	fs.StringVar(&f.KeyFile, "nats-key", "", "client key file for NATS mutual TLS (with --nats-cert)")
	return f
}

// Validate reports the first inconsistent or unreadable setting as a usage error.
func (f *Flags) Validate() error {
	n := 0
	for _, set := range []bool{f.User != "" || f.Password != "", f.NKeyFile != "", f.CredFile != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return cli.Usagef("give one of --nats-user/--nats-password, --nats-nkey or --nats-creds, not several")
	case (f.User == "") != (f.Password == ""):
		return cli.Usagef("--nats-user and --nats-password go together: give both or neither")
	case (f.CertFile == "") != (f.KeyFile == ""):
		return cli.Usagef("--nats-cert and --nats-key go together: give both or neither")
	}
	for _, file := range []struct{ flag, path string }{
		{"--nats-nkey", f.NKeyFile}, {"--nats-creds", f.CredFile}, {"--nats-ca", f.CAFile},
		{"--nats-cert", f.CertFile}, {"--nats-key", f.KeyFile},
	} {
		if file.path == "" {
			continue
		}
		if _, err := os.Stat(file.path); err != nil {
			return cli.Usagef("%s %s: %v", file.flag, file.path, err)
		}
	}
	return nil
}

// Secured reports whether any credential or TLS setting was given.
func (f *Flags) Secured() bool {
	return f.User != "" || f.NKeyFile != "" || f.CredFile != "" || f.CAFile != "" || f.CertFile != ""
}

// Auth returns the credential and TLS options alone.
func (f *Flags) Auth() ([]nats.Option, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case f.User != "":
		opts = append(opts, nats.UserInfo(f.User, f.Password))
	case f.NKeyFile != "":
		o, err := natsauth.ClientOptions(f.NKeyFile)
		if err != nil {
			return nil, cli.Usagef("--nats-nkey %s: %v", f.NKeyFile, err)
		}
		opts = append(opts, o...)
	case f.CredFile != "":
		opts = append(opts, nats.UserCredentials(f.CredFile))
	}
	if f.CAFile != "" {
		opts = append(opts, nats.RootCAs(f.CAFile))
	}
	if f.CertFile != "" {
		opts = append(opts, nats.ClientCert(f.CertFile, f.KeyFile))
	}
	return opts, nil
}

// Options returns the options of a client connection named name: the
// credentials and TLS settings, explicit reconnect behaviour (forever, every
// ReconnectWait plus jitter), and handlers that log disconnects, reconnects and
// asynchronous errors on log.
func (f *Flags) Options(name string, log *slog.Logger) ([]nats.Option, error) {
	auth, err := f.Auth()
	if err != nil {
		return nil, err
	}
	return append(ConnOptions(name, log), auth...), nil
}

// Connect connects to url as a client named name, with the Options of f.
func (f *Flags) Connect(url, name string, log *slog.Logger) (*nats.Conn, error) {
	opts, err := f.Options(name, log)
	if err != nil {
		return nil, err
	}
	return Connect(url, opts)
}

// ConnOptions are the reconnect and logging options of a connection named name,
// without credentials.
func ConnOptions(name string, log *slog.Logger) []nats.Option {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("nats_conn", name)
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(ReconnectWait),
		nats.ReconnectJitter(ReconnectJitter, ReconnectJitterTLS),
		nats.Timeout(ConnectTimeout),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS: reconnecting", "url", nc.ConnectedUrlRedacted(), "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Warn("NATS connection closed", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("NATS error", "subject", subj, "err", err)
		}),
	}
}

// Connect connects to url (comma-separated URLs of a cluster's nodes are tried
// in random order, and reconnects go to any node the cluster advertises) with
// opts, naming url in the error.
func Connect(url string, opts []nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		hint := "is the broker running and reachable?"
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			hint = "check --nats-user/--nats-password, --nats-nkey or --nats-creds"
		} else if errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) {
			hint = "check the broker's TLS settings and --nats-ca/--nats-cert/--nats-key"
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w (%s)", url, err, hint)
	}
	return nc, nil
}
