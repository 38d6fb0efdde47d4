package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	Approval
}

// Kinds of ApprovalEvent.
const (
	ApprovalAsked    = "approval_asked"
	ApprovalAnswered = "approval_answered"
)
