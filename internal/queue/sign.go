package queue

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ErrForgedJob is the error of a job message whose signature is missing or
// does not verify under the fleet's job-signing key: it was not published by
// a front-end, and is never run.
var ErrForgedJob = errors.New("job message not signed by a front-end")

// publishSigningKey makes sure the secrets bucket holds the public half of
// the job-signing key derived from key, for workers to verify job messages
// with.
func publishSigningKey(ctx context.Context, kv jetstream.KeyValue, key []byte) error {
	pub := jobs.SigningKey(key).Public().(ed25519.PublicKey)
	e, err := kv.Get(ctx, jobs.SigningKeyName)
	if err == nil && bytes.Equal(e.Value(), pub) {
		return nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("read the job-signing key: %w", err)
	}
	if _, err := kv.Put(ctx, jobs.SigningKeyName, pub); err != nil {
		return fmt.Errorf("publish the job-signing key: %w", err)
	}
	return nil
}

// SignMessage sets the signature header of m, a job message, under key (the
// job-signing key).
func SignMessage(m *nats.Msg, key ed25519.PrivateKey) {
	m.Header.Set(jobs.SignatureHeader, jobs.SignJob(key, m.Data))
}

// refetchAfter bounds how often a verifier re-reads the public key when a
// signature fails (a key that changed with the proxy key).
const refetchAfter = 2 * time.Second

// Verifier checks job messages' signatures with the fleet's job-signing
// public key, read from the secrets bucket on first use and again when a
// signature fails under the one it has (at most every refetchAfter).
type Verifier struct {
	nc  *nats.Conn
	sub jobs.Subjects

	mu      sync.Mutex
	pub     ed25519.PublicKey
	fetched time.Time
}

// NewVerifier returns a verifier that reads the key over nc.
func NewVerifier(nc *nats.Conn, s jobs.Subjects) *Verifier { return &Verifier{nc: nc, sub: s} }

// Verify returns nil when sig is data's signature, an error wrapping
// ErrForgedJob when it is not, and another error when the key cannot be read
// (retry later).
func (v *Verifier) Verify(ctx context.Context, data []byte, sig string) error {
	if sig == "" {
		return fmt.Errorf("%w: it carries no %s header", ErrForgedJob, jobs.SignatureHeader)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pub != nil && jobs.VerifyJob(v.pub, data, sig) {
		return nil
	}
	if v.pub != nil && time.Since(v.fetched) < refetchAfter {
		return fmt.Errorf("%w: the signature does not verify", ErrForgedJob)
	}
	pub, err := v.fetch(ctx)
	if err != nil {
		return err
	}
	v.pub, v.fetched = pub, time.Now()
	if !jobs.VerifyJob(pub, data, sig) {
		return fmt.Errorf("%w: the signature does not verify", ErrForgedJob)
	}
	return nil
}

func (v *Verifier) fetch(ctx context.Context) (ed25519.PublicKey, error) {
	bucket := v.sub.SecretsBucket()
	msg, err := v.nc.RequestWithContext(ctx, v.sub.DirectGet("KV_"+bucket, "$KV."+bucket+"."+jobs.SigningKeyName), nil)
	if err != nil {
		return nil, fmt.Errorf("read the job-signing key: %w", err)
	}
	switch st := msg.Header.Get("Status"); {
	case st == "404" || msg.Header.Get("KV-Operation") != "":
		return nil, errors.New("read the job-signing key: the secrets bucket has none yet (no front-end has started)")
	case st != "":
		return nil, fmt.Errorf("read the job-signing key: %s %s", st, msg.Header.Get("Description"))
	case len(msg.Data) != ed25519.PublicKeySize:
		return nil, fmt.Errorf("read the job-signing key: %d bytes, want %d", len(msg.Data), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(msg.Data), nil
}
