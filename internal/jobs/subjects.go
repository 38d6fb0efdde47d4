package jobs

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix unless configured.
const DefaultPrefix = "mcpexec"

// Subjects builds every wire name from one prefix. The zero value uses
// DefaultPrefix.
type Subjects struct {
	Prefix string
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// JobsStream is the work-queue stream of pending jobs.
func (s Subjects) JobsStream() string { return strings.ToUpper(s.p()) + "_JOBS" }

// EventsStream is the limits stream of lifecycle events.
func (s Subjects) EventsStream() string { return strings.ToUpper(s.p()) + "_EVENTS" }

// Job is the subject jobs of pool are published on.
func (s Subjects) Job(pool string) string { return s.p() + ".jobs." + pool }

// LangJob is the subject of pool's jobs in language lang: Job(pool) for
// Python, Job(pool) + "." + lang for the others, so that only workers that
// can run a language take its jobs.
func (s Subjects) LangJob(pool, lang string) string {
	if lang == "" || lang == LangPython {
		return s.Job(pool)
	}
	return s.Job(pool) + "." + lang
}

// AllJobs matches every pool's job subject.
func (s Subjects) AllJobs() string { return s.p() + ".jobs.>" }

// Event is the subject of one event of job.
func (s Subjects) Event(job string, kind EventKind) string {
	return s.p() + ".events." + job + "." + string(kind)
}

// ParseEvent returns the job and kind an event subject names, and whether
// subject is one.
func (s Subjects) ParseEvent(subject string) (job string, kind EventKind, ok bool) {
	rest, ok := strings.CutPrefix(subject, s.p()+".events.")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], EventKind(rest[i+1:]), true
}

// DirectGet is the JetStream API subject that reads the last message of
// subject in stream (a direct get).
func (s Subjects) DirectGet(stream, subject string) string {
	return "$JS.API.DIRECT.GET." + stream + "." + subject
}

// MsgGet is the JetStream API subject that reads a message of stream
// through its leader: unlike a direct get, which any replica answers, it
// never answers from a replica that lags behind.
func (s Subjects) MsgGet(stream string) string {
	return "$JS.API.STREAM.MSG.GET." + stream
}

// JobEvents matches every event of job.
func (s Subjects) JobEvents(job string) string { return s.p() + ".events." + job + ".*" }

// AllEvents matches every event.
func (s Subjects) AllEvents() string { return s.p() + ".events.>" }

// Output is the core subject of a job's live output chunks.
func (s Subjects) Output(job string) string { return s.p() + ".output." + job }

// Cancel is the core subject a job's cancellation is announced on.
func (s Subjects) Cancel(job string) string { return s.p() + ".cancel." + job }

// ProxyQueue is the queue group every front-end's proxy responder joins: a
// sandbox's call is answered by one front-end, whichever submitted the job.
const ProxyQueue = "frontends"

// ProxyAny is the request subject of proxy calls that any front-end can answer
// (memory, docs across the job's servers, job results).
func (s Subjects) ProxyAny() string { return s.p() + ".proxy.any" }

// ProxyServer is the request subject of proxy calls for one MCP server: only
// front-ends that proxy server answer it. Server names may hold any text, so
// the token is their base32 form.
func (s Subjects) ProxyServer(server string) string {
	return s.p() + ".proxy.srv." + serverToken.EncodeToString([]byte(server))
}

// AllProxy matches every proxy subject.
func (s Subjects) AllProxy() string { return s.p() + ".proxy.>" }

var serverToken = base32.HexEncoding.WithPadding(base32.NoPadding)

// State is the request subject of a state-service operation such as "job.get".
func (s Subjects) State(op string) string { return s.p() + ".state." + op }

// SyncBarrier is where the brokers answer sync barrier requests: an answer
// once what they acknowledged before the request is on disk (durable).
func (s Subjects) SyncBarrier() string { return s.p() + ".sync" }

// StateService is the NATS micro service name of the state service.
func (s Subjects) StateService() string { return s.p() + "-state" }

// Consumer is the durable consumer name of pool's workers.
func (s Subjects) Consumer(pool string) string { return "workers-" + pool }

// LangConsumer names the durable consumer of pool's jobs in language lang,
// shared by the pool's workers that run it: Consumer(pool) for Python.
func (s Subjects) LangConsumer(pool, lang string) string {
	if lang == "" || lang == LangPython {
		return s.Consumer(pool)
	}
	return lang + "-workers-" + pool
}

// WorkerService is the NATS micro service name every worker registers, so that
// front-ends can see workers are alive ($SRV.PING.<name>).
func (s Subjects) WorkerService() string { return s.p() + "-worker" }

// WorkerJobs is the subject of jobs routed to one worker: the jobs of the
// sessions it holds.
func (s Subjects) WorkerJobs(worker string) string { return s.p() + ".wjobs." + worker }

// AllWorkerJobs matches every worker's routed-job subject.
func (s Subjects) AllWorkerJobs() string { return s.p() + ".wjobs.*" }

// WorkerConsumer is the durable consumer name of one worker's routed jobs.
func (s Subjects) WorkerConsumer(worker string) string { return "worker-" + worker }

// SessionsBucket is the key-value bucket that maps sessions to the workers that
// hold them.
func (s Subjects) SessionsBucket() string { return strings.ToUpper(s.p()) + "_SESSIONS" }

// WorkerSessions is the request subject on which a worker answers whether it
// holds a session.
func (s Subjects) WorkerSessions(worker string) string { return s.p() + ".wsession." + worker }

// FilesBucket is the object store of jobs' files (inputs and what they
// wrote): only the broker's state service reads and writes it.
func (s Subjects) FilesBucket() string { return strings.ToUpper(s.p()) + "_FILES" }

// FileObject is the name, in FilesBucket, of job's input file name
// (attempt 0) or of a file attempt wrote.
func FileObject(job string, attempt int, name string) string {
	if attempt == 0 {
		return job + "/in/" + name
	}
	return fmt.Sprintf("%s/out/%d/%s", job, attempt, name)
}

// SecretsBucket is the key-value bucket of the fleet's secrets (the proxy key):
// only front-ends and the broker may read it.
func (s Subjects) SecretsBucket() string { return strings.ToUpper(s.p()) + "_SECRETS" }

// ProxyKeyName is the key of the proxy key in the secrets bucket.
const ProxyKeyName = "proxy-key"

// WorkerStatus is the subject every worker answers with its status (no queue
// group: an asker collects all answers).
func (s Subjects) WorkerStatus() string { return s.p() + ".workers.status" }

// BrokerStalled is the subject on which the brokers of a cluster whose jobs
// stream no replica will lead say so to each other, before each replaces
// its copy (only the broker role may use it).
func (s Subjects) BrokerStalled() string { return s.p() + ".broker.stalled" }

// FrontendStatus is the subject every front-end answers with its status (no
// queue group: an asker, a console, collects all answers).
func (s Subjects) FrontendStatus() string { return s.p() + ".frontends.status" }

// MemoryStream is the stream of memory writes (the last write of each key is
// kept): every state replica folds it.
func (s Subjects) MemoryStream() string { return strings.ToUpper(s.p()) + "_MEMORY" }

// AllMemory matches every memory write.
func (s Subjects) AllMemory() string { return s.p() + ".memory.>" }

// Memory is the subject of the writes of key in namespace ns: one subject per
// key, so that compare-and-set is JetStream's expected last subject sequence.
// Keys may hold any text: the token is a hash of namespace and key (the
// write itself carries both).
func (s Subjects) Memory(ns, key string) string {
	sum := sha256.Sum256([]byte(ns + "\x00" + key))
	return s.p() + ".memory." + strings.TrimSuffix(NamespaceTag(ns), "-") + "." + hex.EncodeToString(sum[:20])
}

// AuditStream is the stream of audit entries of proxied tool calls.
func (s Subjects) AuditStream() string { return strings.ToUpper(s.p()) + "_AUDIT" }

// AllAudit matches every audit entry.
func (s Subjects) AllAudit() string { return s.p() + ".audit.>" }

// Audit is the subject of namespace ns's audit entries (its tag: the
// entry itself names the namespace).
func (s Subjects) Audit(ns string) string {
	return s.p() + ".audit." + strings.TrimSuffix(NamespaceTag(ns), "-")
}

// AuditMsgID is the message id of the audit entry id: a retried publish
// is stored once.
func (s Subjects) AuditMsgID(id string) string { return "audit." + id }

// AdminBackup is the subject an operator asks one broker node (by server name)
// to write a snapshot of its state file on.
func (s Subjects) AdminBackup(server string) string { return s.p() + ".admin.backup." + server }

// Message ids (Nats-Msg-Id) and bucket keys: the other wire names.

// EventMsgID is the message id of an event: one event of each kind per
// attempt, so a republished event is deduplicated.
func (s Subjects) EventMsgID(job string, kind EventKind, attempt int) string {
	return fmt.Sprintf("%s.%s.%d", job, kind, attempt)
}

// StartMsgID is the message id of a start of attempt recorded by one
// delivery of the job's message (queue.Client.PublishStart): the
// delivery's own token in it, so that JetStream deduplicates that
// delivery's retries only, and a retry can tell its own start, found in the
// job's history, from another delivery's start of the same attempt.
func (s Subjects) StartMsgID(job string, attempt int, delivery string) string {
	return fmt.Sprintf("%s.%s.%d.%s", job, EventStarted, attempt, delivery)
}

// JobMsgID is the message id of a job's message in the jobs stream.
func (s Subjects) JobMsgID(job string) string { return job }

// SessionJobMsgID is the message id of a session's job forwarded to the
// worker holding the session.
func (s Subjects) SessionJobMsgID(job string) string { return job + ".session" }

// MemoryMsgID is the message id of a memory write with a write id.
func (s Subjects) MemoryMsgID(writeID string) string { return "mem." + writeID }

// SessionKey is the key of session in namespace in the sessions bucket (and
// the session's name in the worker's sandbox runtime). Sessions of different
// namespaces never meet.
func (s Subjects) SessionKey(namespace, session string) string {
	// Namespaces may hold any text; keys may not. '=' never occurs in a valid
	// id, so the hex form (and "=" for no namespace) cannot collide with a plain one.
	ns := "=" + hex.EncodeToString([]byte(namespace))
	if ValidID(namespace) {
		ns = namespace
	}
	return ns + "." + session
}
