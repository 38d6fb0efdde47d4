package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Approval is a proxied call parked until a person approves or denies it, as
// GET /api/approvals lists it.
type Approval struct {
	ID     string `json:"id"`
	JobID  string `json:"job_id"`
	Server string `json:"server"`
	Tool   string `json:"tool"`
	// Arguments are the call's arguments, whole when their JSON is at most
	// MaxApprovalArgs bytes; else the first MaxApprovalArgs bytes as a
	// string, with ArgumentsTruncated set. ArgumentsBytes and
	// ArgumentsSHA256 describe them whole.
	Arguments          json.RawMessage `json:"arguments"`
	ArgumentsTruncated bool            `json:"arguments_truncated,omitempty"`
	ArgumentsBytes     int             `json:"arguments_bytes"`
	ArgumentsSHA256    string          `json:"arguments_sha256"`
	// Rule is the rule whose verdict was "ask".
	Rule      string    `json:"rule"`
	AskedAt   time.Time `json:"asked_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// MaxApprovalArgs bounds the bytes of arguments an Approval shows.
const MaxApprovalArgs = 4 << 10

// ApprovalsBucket is the key-value bucket of the proxied calls parked for a
// person's approval, and their answers: front-ends (and the broker) only;
// workers may neither read nor write it.
func (s Subjects) ApprovalsBucket() string { return strings.ToUpper(s.p()) + "_APPROVALS" }

// ApprovalKey is the key, in ApprovalsBucket, of namespace ns's approval id:
// the namespace's digest, then the id, so that one namespace's keys are
// listed alone (ApprovalKeys) and another's token cannot even name them.
func (s Subjects) ApprovalKey(ns, id string) string { return approvalNS(ns) + "." + id }

// ApprovalKeys matches every key of namespace ns in ApprovalsBucket.
func (s Subjects) ApprovalKeys(ns string) string { return approvalNS(ns) + ".*" }

func approvalNS(ns string) string {
	sum := sha256.Sum256([]byte(NamespaceOf(ns)))
	return hex.EncodeToString(sum[:16])
}

// ApprovalEvent tells that a call was parked for approval (Kind
// ApprovalAsked, State "pending") or that it stopped waiting (Kind
// ApprovalAnswered; State "approved", "denied", "timed_out" or
// "withdrawn", with who decided and why).
type ApprovalEvent struct {
	Kind      string `json:"kind"`
	State     string `json:"state"`
	DecidedBy string `json:"decided_by,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// Scope is the answer's scope when it widened an approval into a Grant.
	Scope string `json:"scope,omitempty"`
	Approval
}

// Kinds of ApprovalEvent.
const (
	ApprovalAsked    = "approval_asked"
	ApprovalAnswered = "approval_answered"
)

// ApprovalAnswer is a person's answer to an approval: the body of POST
// /api/approvals/{id}. Scope widens an approval beyond the one call it
// answers; the default, "call", never does.
type ApprovalAnswer struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
	// Scope is "call" (or empty): this call only; "job": also the job's
	// later calls of the same tool; "namespace": also the namespace's calls
	// of the same tool, by any job, for Minutes. Only an approval may be
	// widened.
	Scope   string `json:"scope,omitempty"`
	Minutes int    `json:"minutes,omitempty"`
}

// Scopes of an ApprovalAnswer.
const (
	ScopeCall      = "call"
	ScopeJob       = "job"
	ScopeNamespace = "namespace"
)

// Bounds of an ApprovalAnswer.
const (
	// MaxApprovalReason bounds the reason of an answer, in bytes.
	MaxApprovalReason = 1 << 10
	// MaxGrantMinutes bounds a namespace grant: the approvals bucket keeps
	// an entry two hours, and a grant lives there.
	MaxGrantMinutes = 120
	// JobGrantFor is how long a job grant lasts at most (a job that runs
	// longer is asked again).
	JobGrantFor = MaxGrantMinutes * time.Minute
)

// Validate says what is wrong with a, in words the caller can act on.
func (a ApprovalAnswer) Validate() error {
	const clip = 40
	quote := func(s string) string {
		if len(s) > clip {
			s = s[:clip] + "…"
		}
		return strconv.Quote(s)
	}
	switch {
	case a.Decision != "approve" && a.Decision != "deny":
		return fmt.Errorf("decision %s: want \"approve\" or \"deny\"", quote(a.Decision))
	case len(a.Reason) > MaxApprovalReason:
		return fmt.Errorf("the reason is %d bytes, over the %d allowed", len(a.Reason), MaxApprovalReason)
	case a.Scope != "" && a.Scope != ScopeCall && a.Scope != ScopeJob && a.Scope != ScopeNamespace:
		return fmt.Errorf("scope %s: want \"call\" (the default), \"job\" or \"namespace\"", quote(a.Scope))
	case a.Decision == "deny" && a.Scope != "" && a.Scope != ScopeCall:
		return fmt.Errorf("scope %q widens an approval: a denial answers its one call only", a.Scope)
	case a.Scope == ScopeNamespace && (a.Minutes < 1 || a.Minutes > MaxGrantMinutes):
		return fmt.Errorf("minutes %d: a namespace grant lasts 1 to %d minutes", a.Minutes, MaxGrantMinutes)
	case a.Scope != ScopeNamespace && a.Minutes != 0:
		return fmt.Errorf("minutes is for scope \"namespace\" only (a job grant lasts as long as the job, at most %d minutes)", MaxGrantMinutes)
	}
	return nil
}

// Grant is a widened approval: later calls of Server/Tool by job JobID
// (Scope "job") or by any job of the namespace (Scope "namespace") are
// allowed without asking until ExpiresAt. Calls the tool rules deny stay
// denied: a grant only answers "ask".
type Grant struct {
	ID        string    `json:"id"`
	Scope     string    `json:"scope"`
	JobID     string    `json:"job_id,omitempty"`
	Server    string    `json:"server"`
	Tool      string    `json:"tool"`
	GrantedBy string    `json:"granted_by"`
	Reason    string    `json:"reason,omitempty"`
	Approval  string    `json:"approval"` // the approval whose answer granted it
	GrantedAt time.Time `json:"granted_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// GrantKey is the key, in ApprovalsBucket, of namespace ns's grant id (apart
// from its approvals: ApprovalKeys never matches it).
func (s Subjects) GrantKey(ns, id string) string { return "grant." + approvalNS(ns) + "." + id }

// GrantKeys matches every grant key of namespace ns in ApprovalsBucket.
func (s Subjects) GrantKeys(ns string) string { return "grant." + approvalNS(ns) + ".*" }
