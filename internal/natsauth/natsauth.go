// Package natsauth gives each role of the fleet its own NATS identity with only
// the permissions it needs, in nats-server's own permission model: Init writes
// a nats-server configuration (NKey users with per-role publish and subscribe
// permissions) and one NKey seed file per role.
//
//   - broker: everything (it creates the streams and runs the state service).
//   - frontend: submit jobs, record submissions, cancellations and its own
//     rejections, query and write state, follow events and output, answer
//     proxy calls, read the fleet's secrets, park and answer calls waiting
//     for approval; no stream administration.
//   - worker: pull jobs and acknowledge them, record the start and outcome of
//     jobs (which the state service applies only with the job's capability),
//     ask the state service the history (cancellation, outcome, last attempt)
//     of the jobs they hold, publish output, make proxy calls, keep the
//     sessions bucket, answer session look-ups (a named worker identity only
//     its own worker id's); no memory, no job records, no events, no
//     secrets, no stream administration.
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
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
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

// Permissions are one identity's subjects.
type Permissions struct {
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	// Responses: the identity may answer the requests it receives (once each,
	// or MaxResponses times), without a publish right on anyone's inbox.
	Responses bool `json:"responses,omitempty"`
	// MaxResponses, when over 1, is how many messages may answer one request:
	// a front-end sends a proxy call's "waiting for a person" notices before
	// its answer (proxy.MaxResponses).
	MaxResponses int `json:"max_responses,omitempty"`
}

// frontendResponses is proxy.MaxResponses: two notices and the answer.
const frontendResponses = 3

// For returns the permissions of identity id whose public NKey is pub, under
// the wire names of s.
//
// A named worker identity (`broker auth add worker NAME`) is bound to the
// worker id NAME: it answers the session look-ups of that worker only, so it
// cannot answer for another worker (and say it holds, or has lost, that
// worker's sessions). The unnamed worker identity answers for any worker id,
// as before named identities existed: give each host its own identity.
func For(id Identity, pubKey string, s jobs.Subjects) (Permissions, error) {
	role := id.Role
	p := s.Prefix
	if p == "" {
		p = jobs.DefaultPrefix
	}
	jobsStream, events := s.JobsStream(), s.EventsStream()
	sessions, secrets, approvals := s.SessionsBucket(), s.SecretsBucket(), s.ApprovalsBucket()
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
			"$JS.API.CONSUMER.MSG.NEXT." + jobsStream + ".>",
			"$JS.ACK." + jobsStream + ".>",
			"$JS.API.CONSUMER.CREATE." + jobsStream + ".>",
			"$JS.API.CONSUMER.DURABLE.CREATE." + jobsStream + ".>",
			"$JS.API.CONSUMER.INFO." + jobsStream + ".>",
			s.Event("*", jobs.EventStarted),
			s.Event("*", jobs.EventFinished),
			// Whether a delivered job was cancelled or already done, and its
			// last attempt: the state service answers for the job whose
			// capability the worker holds (a direct get would read any job's).
			s.State(state.OpJobHistory),
			// Files of the job it holds, proven with its capability: its
			// inputs to read, what its attempt wrote to store. The file store
			// itself is the state service's alone.
			s.State(state.OpFileInput),
			s.State(state.OpFilePut),
			s.Output("*"),
			s.AllProxy(),
			s.WorkerJobs("*"), // a session's job forwarded to the worker holding it (as signed)
			// Whether the worker a session's entry names still holds it (a
			// session's job taken from the pool). Such a request may also
			// end a session; a worker host may delete the sessions
			// bucket's entries anyway.
			s.WorkerSessions("*"),
			// The brokers' sync policy (their state service's metadata):
			// the worker group-commits its events only under sync always,
			// and asks for a barrier where the brokers keep it so.
			"$SRV.INFO." + s.StateService(),
			s.SyncBarrier(),
			// The job-signing public key, and no other secret.
			"$JS.API.DIRECT.GET.KV_" + secrets + ".$KV." + secrets + "." + jobs.SigningKeyName,
		}
		pub = append(pub, kv(sessions)...)
		lookups := s.WorkerSessions("*")
		if id.Name != "" {
			lookups = s.WorkerSessions(WorkerID(id))
		}
		return Permissions{Publish: pub, Responses: true, Subscribe: []string{
			InboxPrefix(pubKey) + ".>", s.Cancel("*"), lookups, "$SRV.>", s.WorkerStatus(),
		}}, nil
	case RoleFrontend:
		pub := []string{
			s.AllJobs(), s.AllWorkerJobs(),
			s.Event("*", jobs.EventSubmitted),
			s.Event("*", jobs.EventCancelled),
			s.Event("*", jobs.EventFinished), // rejections, sessions that are gone
			s.Cancel("*"),
			// Audit entries of the tool calls it answers (proven with the
			// audit key: the state replicas keep only those).
			s.AllAudit(),
			p + ".state.>",
			s.WorkerSessions("*"), s.WorkerStatus(), s.FrontendStatus(),
			s.SyncBarrier(), // its writes durable where the brokers keep sync always with barriers
			"$SRV.PING", "$SRV.PING.>", "$SRV.INFO.>",
			"$JS.API.DIRECT.GET." + events + ".>",
			"$JS.API.STREAM.INFO." + events,
			"$JS.API.STREAM.INFO." + jobsStream,       // queue depth, doctor
			"$JS.API.STREAM.INFO." + s.MemoryStream(), // the console's fleet page
			"$JS.API.STREAM.MSG.GET." + events,
			// Following the events stream (/api/events, the console's live
			// list): an ordered consumer is an ephemeral pull consumer with
			// no acks, created again (and the old one deleted) when it
			// misses a message or a heartbeat.
			"$JS.API.CONSUMER.CREATE." + events + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + events + ".>",
			"$JS.API.CONSUMER.DELETE." + events + ".>",
			// Listing a namespace's sessions reads the sessions bucket.
			"$JS.API.CONSUMER.CREATE.KV_" + sessions + ".>",
			"$JS.API.CONSUMER.DELETE.KV_" + sessions + ".>",
			"$JS.FC.KV_" + sessions + ".>",
		}
		// Calls parked for approval: any front-end lists and answers them,
		// and the one holding the call watches its key.
		pub = append(pub, "$JS.API.CONSUMER.CREATE.KV_"+approvals+".>", "$JS.API.CONSUMER.DELETE.KV_"+approvals+".>", "$JS.FC.KV_"+approvals+".>")
		pub = append(pub, kv(sessions)...)
		pub = append(pub, kv(secrets)...)
		pub = append(pub, kv(approvals)...)
		return Permissions{Publish: pub, Responses: true, MaxResponses: frontendResponses, Subscribe: []string{
			InboxPrefix(pubKey) + ".>", s.AllProxy(), s.AllEvents(), p + ".output.>", s.FrontendStatus(),
		}}, nil
	}
	return Permissions{}, fmt.Errorf("unknown role %q: want one of %s", role, strings.Join(Roles, ", "))
}

// Identity is one NKey user of the fleet: a role, and a name when one role has
// several (one per worker host or front-end, see Add). Its seed file is
// <role>.nk or <role>-<name>.nk in the credentials directory.
type Identity struct {
	Role string
	Name string
}

// File is the identity's seed file name.
func (id Identity) File() string {
	if id.Name == "" {
		return id.Role + ".nk"
	}
	return id.Role + "-" + id.Name + ".nk"
}

func (id Identity) String() string { return strings.TrimSuffix(id.File(), ".nk") }

// WorkerID is the worker id a named worker identity is bound to: its name
// (a worker runs as `worker --id NAME`). It is "" for the unnamed worker
// identity, which may run as any worker id.
func WorkerID(id Identity) string {
	if id.Role != RoleWorker {
		return ""
	}
	return id.Name
}

// IdentityOf returns the identity a seed file stands for by its name
// (<role>.nk or <role>-<name>.nk, as Init and Add write them), and whether
// it names one.
func IdentityOf(seedFile string) (Identity, bool) { return parseIdentity(filepath.Base(seedFile)) }

var identityName = regexp.MustCompile(`^[a-z0-9][a-z0-9_]{0,62}$`)

// parseIdentity returns the identity a seed file name stands for.
func parseIdentity(file string) (Identity, bool) {
	base, ok := strings.CutSuffix(file, ".nk")
	if !ok {
		return Identity{}, false
	}
	role, name, _ := strings.Cut(base, "-")
	if !slices.Contains(Roles, role) || (name != "" && !identityName.MatchString(name)) {
		return Identity{}, false
	}
	return Identity{Role: role, Name: name}, true
}

// InboxPrefix is the inbox prefix of the identity whose public NKey is pub.
// Each identity may subscribe below its own prefix only, so no identity hears
// the answers (job deliveries, state replies, secrets) meant for another.
func InboxPrefix(pub string) string { return "_INBOX." + pub }

// ClientOptions are the options of a connection authenticated with the seed
// file: the NKey, and the identity's own inbox prefix, which its permissions
// require (a client on the default _INBOX.> would be refused its answers).
func ClientOptions(seedFile string) ([]nats.Option, error) {
	data, err := os.ReadFile(seedFile)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w (want a seed file starting with SU)", seedFile, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	kp.Wipe()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		return nil, err
	}
	return []nats.Option{o, nats.CustomInboxPrefix(InboxPrefix(pub))}, nil
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
	} else if err := removeIdentities(dir); err != nil {
		return nil, err
	}
	for _, r := range Roles {
		if err := writeSeed(filepath.Join(dir, Identity{Role: r}.File())); err != nil {
			return nil, fmt.Errorf("%s: %w", r, err)
		}
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("route secret: %w", err)
	}
	if err := os.WriteFile(secretFile, []byte(base64.RawURLEncoding.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", secretFile, err)
	}
	if err := WriteConfig(dir, s); err != nil {
		return nil, err
	}
	return files, nil
}

// Add mints a new identity of role named name in dir (a worker host's or a
// front-end's own credential) and rewrites dir/nats.conf; the brokers take it
// on a reload (SIGHUP) or restart. It returns the new seed file.
func Add(dir string, id Identity, s jobs.Subjects) (string, error) {
	if !slices.Contains(Roles, id.Role) {
		return "", fmt.Errorf("unknown role %q: want one of %s", id.Role, strings.Join(Roles, ", "))
	}
	if !identityName.MatchString(id.Name) {
		return "", fmt.Errorf("identity name %q: want 1-63 lower-case letters, digits or '_', starting with a letter or digit", id.Name)
	}
	if _, err := os.Stat(filepath.Join(dir, ConfigName)); err != nil {
		return "", fmt.Errorf("%s: run `broker auth init %s` first", filepath.Join(dir, ConfigName), dir)
	}
	f := filepath.Join(dir, id.File())
	if _, err := os.Stat(f); err == nil {
		return "", fmt.Errorf("%s exists: remove it first (`broker auth remove`) to replace it", f)
	}
	if err := writeSeed(f); err != nil {
		return "", err
	}
	return f, WriteConfig(dir, s)
}

// Remove revokes an identity: its seed file is deleted and dir/nats.conf
// rewritten without it; the brokers refuse it once they reload.
func Remove(dir string, id Identity, s jobs.Subjects) error {
	f := filepath.Join(dir, id.File())
	if _, ok := parseIdentity(id.File()); !ok {
		return fmt.Errorf("no identity %q: want ROLE [NAME]", id)
	}
	if err := os.Remove(f); err != nil {
		return fmt.Errorf("revoke %s: %w", id, err)
	}
	return WriteConfig(dir, s)
}

func removeIdentities(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, ok := parseIdentity(e.Name()); ok {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeSeed(file string) error {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return fmt.Errorf("create key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write seed: %w", err)
	}
	_, err = f.Write(append(seed, '\n'))
	return errors.Join(err, f.Sync(), f.Close())
}

// responseTTL bounds how long a responder may answer a request it received
// (a proxied tool call may take as long as its job).
const responseTTL = "2h"

// WriteConfig writes dir/nats.conf from the identities whose seed files are in
// dir: one NKey user each, with its role's permissions and its own inbox.
func WriteConfig(dir string, s jobs.Subjects) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type user struct {
		NKey        string `json:"nkey"`
		Permissions struct {
			Publish        map[string][]string `json:"publish"`
			Subscribe      map[string][]string `json:"subscribe"`
			AllowResponses map[string]any      `json:"allow_responses,omitempty"`
		} `json:"permissions"`
	}
	var users []user
	var conf strings.Builder
	file := filepath.Join(dir, ConfigName)
	conf.WriteString("# mcpexec NATS authorization, written by `broker auth`: one NKey user per\n")
	conf.WriteString("# identity (broker, frontend, worker, admin and those `broker auth add` minted),\n")
	conf.WriteString("# each with only its role's subjects and its own inbox. Do not edit: `broker\n")
	conf.WriteString("# auth add|remove` rewrites it. Serve it with `broker --nats-config " + file + "`.\n")
	conf.WriteString("# Routes between broker nodes authenticate as " + RouteUser + " with the password in\n")
	conf.WriteString("# " + RouteSecretName + " beside this file: every broker node needs this file,\n# broker.nk and " + RouteSecretName + ".\n")
	for _, e := range ents {
		id, ok := parseIdentity(e.Name())
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		pub, err := kp.PublicKey()
		kp.Wipe()
		if err != nil {
			return err
		}
		perms, err := For(id, pub, s)
		if err != nil {
			return err
		}
		u := user{NKey: pub}
		u.Permissions.Publish = map[string][]string{"allow": perms.Publish}
		u.Permissions.Subscribe = map[string][]string{"allow": perms.Subscribe}
		if perms.Responses {
			u.Permissions.AllowResponses = map[string]any{"max": max(perms.MaxResponses, 1), "expires": responseTTL}
		}
		users = append(users, u)
		fmt.Fprintf(&conf, "# %s: %s\n", id, pub)
	}
	// nats-server's parser takes JSON, but not \u escapes: keep '>' as is.
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"users": users}); err != nil {
		return err
	}
	conf.WriteString("authorization ")
	conf.Write(body.Bytes())
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf.String()), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return os.Rename(tmp, file)
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
