// Package audit is the audit trail of proxied tool calls in plain types: an
// Entry as a front-end records it (who, which tool, a digest and a redacted
// preview of the arguments, the decision and the outcome), the proof that a
// front-end wrote it (an HMAC under a key derived from the fleet's proxy
// key, which workers never hold), and the hash chain a state replica links
// each namespace's entries into, with Verify naming the first entry that
// does not fit. It imports only the standard library; the NATS writer and
// the bbolt store are elsewhere (package auditlog, state/boltstore).
package audit
