// Package natsauth gives each role of the fleet its own NATS identity with only
// the permissions it needs, in nats-server's own permission model: Init writes
// a nats-server configuration (NKey users with per-role publish and subscribe
// permissions) and one NKey seed file per role.
//
//   - broker: everything (it creates the streams and runs the state service).
//   - frontend: submit jobs, record submissions, cancellations and its own
//     rejections, query and write state, follow events and output, answer
//     proxy calls, read the fleet's secrets; no stream administration.
//   - worker: pull jobs and acknowledge them, record the start and outcome of
//     jobs (which the state service applies only with the job's capability),
//     look up cancellations, publish output, make proxy calls, keep the
//     sessions bucket; no memory, no job records, no events, no secrets, no
//     stream administration.
//   - admin: everything, for operators' tools.
package natsauth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Roles of the fleet.
const (
	RoleBroker   = "broker"
	RoleFrontend = "frontend"
	RoleWorker   = "worker"
	RoleAdmin    = "admin"
)

// Roles lists every role, in the order Init writes them.
var Roles = []string{RoleBroker, RoleFrontend, RoleWorker, RoleAdmin}

// ConfigName is the configuration file Init writes.
const ConfigName = "nats.conf"

// RouteSecretName is the file, beside ConfigName, that holds the password the
// broker nodes' routes authenticate with (as RouteUser).
const RouteSecretName = "route.secret"

// RouteUser is the user the broker nodes' routes authenticate as with the
// route secret.
const RouteUser = "mcpexec-route"

// SeedFile is the NKey seed file of role in dir.
func SeedFile(dir, role string) string { return filepath.Join(dir, role+".nk") }

// Permissions are one role's subjects.
type Permissions struct {
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
}

// For returns role's permissions under the wire names of s.
func For(role string, s jobs.Subjects) (Permissions, error) {
	p := s.Prefix
	if p == "" {
		p = jobs.DefaultPrefix
	}
	jobsStream, events := s.JobsStream(), s.EventsStream()
	sessions, secrets := s.SessionsBucket(), s.SecretsBucket()
	kv := func(bucket string) []string {
		return []string{
			"$KV." + bucket + ".>",
			"$JS.API.STREAM.INFO.KV_" + bucket,
			"$JS.API.DIRECT.GET.KV_" + bucket + ".>",
			"$JS.API.STREAM.MSG.GET.KV_" + bucket,
		}
	}
	switch role {
	case RoleBroker, RoleAdmin:
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}, nil
	case RoleWorker:
		pub := []string{
			"_INBOX.>", // answers: session look-ups, service pings
			"$JS.API.CONSUMER.MSG.NEXT." + jobsStream + ".>",
			"$JS.ACK." + jobsStream + ".>",
			"$JS.API.CONSUMER.CREATE." + jobsStream + ".>",
			"$JS.API.CONSUMER.DURABLE.CREATE." + jobsStream + ".>",
			"$JS.API.CONSUMER.INFO." + jobsStream + ".>",
			s.Event("*", jobs.EventStarted),
			s.Event("*", jobs.EventFinished),
			"$JS.API.DIRECT.GET." + events + "." + s.Event("*", jobs.EventCancelled),
			"$JS.API.DIRECT.GET." + events + "." + s.Event("*", jobs.EventStarted),  // a job's last attempt
			"$JS.API.DIRECT.GET." + events + "." + s.Event("*", jobs.EventFinished), // a redelivered job already done
			s.Output("*"),
			s.AllProxy(),
			s.WorkerJobs("*"), // a session's job forwarded to the worker holding it
		}
		pub = append(pub, kv(sessions)...)
		return Permissions{Publish: pub, Subscribe: []string{
			"_INBOX.>", s.Cancel("*"), s.WorkerSessions("*"), "$SRV.>", s.WorkerStatus(),
		}}, nil
	case RoleFrontend:
		pub := []string{
			"_INBOX.>", // answers to proxy calls
			s.AllJobs(), s.AllWorkerJobs(),
			s.Event("*", jobs.EventSubmitted),
			s.Event("*", jobs.EventCancelled),
			s.Event("*", jobs.EventFinished), // rejections, sessions that are gone
			s.Cancel("*"),
			p + ".state.>",
			s.WorkerSessions("*"), s.WorkerStatus(), s.FrontendStatus(),
			"$SRV.PING", "$SRV.PING.>", "$SRV.INFO.>",
			"$JS.API.DIRECT.GET." + events + ".>",
			"$JS.API.STREAM.INFO." + events,
			"$JS.API.STREAM.INFO." + jobsStream,       // queue depth, doctor
			"$JS.API.STREAM.INFO." + s.MemoryStream(), // the console's fleet page
			"$JS.API.STREAM.MSG.GET." + events,
			// Listing a namespace's sessions reads the sessions bucket.
			"$JS.API.CONSUMER.CREATE.KV_" + sessions + ".>",
			"$JS.API.CONSUMER.DELETE.KV_" + sessions + ".>",
			"$JS.FC.KV_" + sessions + ".>",
		}
		pub = append(pub, kv(sessions)...)
		pub = append(pub, kv(secrets)...)
		return Permissions{Publish: pub, Subscribe: []string{
			"_INBOX.>", s.AllProxy(), s.AllEvents(), p + ".output.>", s.FrontendStatus(),
		}}, nil
	}
	return Permissions{}, fmt.Errorf("unknown role %q: want one of %s", role, strings.Join(Roles, ", "))
}

// Init writes dir/nats.conf, one seed file per role, dir/<role>.nk, and the
// route secret dir/route.secret (all 0600). It refuses to overwrite existing
// files unless force is set.
//
// The configuration authenticates clients only; nats-server takes route
// credentials from the cluster options, which the broker sets from
// route.secret, so every broker node needs the same directory.
func Init(dir string, s jobs.Subjects, force bool) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	files := []string{filepath.Join(dir, ConfigName)}
	for _, r := range Roles {
		files = append(files, SeedFile(dir, r))
	}
	secretFile := filepath.Join(dir, RouteSecretName)
	files = append(files, secretFile)
	if !force {
		for _, f := range files {
			if _, err := os.Stat(f); err == nil {
				return nil, fmt.Errorf("%s exists: keep it, or pass --force to replace every credential in %s", f, dir)
			}
		}
	}
	type user struct {
		NKey        string `json:"nkey"`
		Permissions struct {
			Publish   map[string][]string `json:"publish"`
			Subscribe map[string][]string `json:"subscribe"`
		} `json:"permissions"`
	}
	var users []user
	var conf strings.Builder
	conf.WriteString("# mcpexec NATS authorization, written by `broker auth init`: one NKey user per\n")
	conf.WriteString("# role (broker, frontend, worker, admin), each with only the subjects it needs.\n")
	conf.WriteString("# Serve it with `broker --nats-config " + files[0] + "`.\n")
	conf.WriteString("# Routes between broker nodes authenticate as " + RouteUser + " with the password in\n")
	conf.WriteString("# " + RouteSecretName + " beside this file: every broker node needs this file,\n# broker.nk and " + RouteSecretName + ".\n")
	for _, r := range Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("create %s key: %w", r, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(SeedFile(dir, r), append(seed, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("write %s seed: %w", r, err)
		}
		perms, err := For(r, s)
		if err != nil {
			return nil, err
		}
		u := user{NKey: pub}
		u.Permissions.Publish = map[string][]string{"allow": perms.Publish}
		u.Permissions.Subscribe = map[string][]string{"allow": perms.Subscribe}
		users = append(users, u)
		fmt.Fprintf(&conf, "# %s: %s\n", r, pub)
	}
	// nats-server's parser takes JSON, but not \u escapes: keep '>' as is.
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"users": users}); err != nil {
		return nil, err
	}
	conf.WriteString("authorization ")
	conf.Write(body.Bytes())
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("route secret: %w", err)
	}
	if err := os.WriteFile(secretFile, []byte(base64.RawURLEncoding.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", secretFile, err)
	}
	if err := os.WriteFile(files[0], []byte(conf.String()), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", files[0], err)
	}
	return files, nil
}

// BrokerSeed returns the broker's seed file next to a configuration Init
// wrote, if there is one.
func BrokerSeed(configFile string) (string, bool) {
	f := SeedFile(filepath.Dir(configFile), RoleBroker)
	if _, err := os.Stat(f); err != nil {
		return "", false
	}
	return f, true
}

// RouteSecretFile is the route secret file beside configFile.
func RouteSecretFile(configFile string) string {
	return filepath.Join(filepath.Dir(configFile), RouteSecretName)
}

// RouteSecret returns the route password in the route.secret file next to a
// configuration Init wrote; ok is false when there is no such file. A file
// that cannot be read or holds no secret is an error, not an absent secret.
func RouteSecret(configFile string) (secret string, ok bool, err error) {
	f := RouteSecretFile(configFile)
	b, err := os.ReadFile(f)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("route secret: %w", err)
	}
	secret = strings.TrimSpace(string(b))
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		return "", false, fmt.Errorf("route secret %s: want one non-empty line (`broker auth init` writes one)", f)
	}
	return secret, true, nil
}

// ErrInsecureListen is the error of a broker asked to listen beyond loopback
// without authentication or TLS.
var ErrInsecureListen = errors.New("refusing to listen beyond loopback without authentication")
