package jobs

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// Job messages are signed: a front-end signs each job message it publishes
// with the fleet's job-signing key (ed25519, derived from the proxy key, so
// every front-end holds the same one and nothing new is distributed among
// them), and a worker runs a delivery only when its signature verifies under
// the public key. Workers read that public key, and nothing else, from the
// secrets bucket. A worker identity can therefore not forge a job (another
// tenant's namespace or session, another job's capability), though it may
// publish on the job subjects to forward a session's job as it was signed.

// SignatureHeader is the NATS header of a job message's signature.
const SignatureHeader = "Mcpexec-Signature"

// SigningKeyName is the key of the job-signing public key in the secrets
// bucket (workers may read this key only).
const SigningKeyName = "job-signing-key"

// SigningKey derives the fleet's job-signing key from its proxy key.
func SigningKey(proxyKey []byte) ed25519.PrivateKey {
	m := hmac.New(sha256.New, proxyKey)
	m.Write([]byte("mcpexec-job-signing/v1"))
	return ed25519.NewKeyFromSeed(m.Sum(nil))
}

func signed(data []byte) []byte {
	return append([]byte("mcpexec-job/v1\x00"), data...)
}

// SignJob returns the signature of a job message's bytes.
func SignJob(key ed25519.PrivateKey, data []byte) string {
	return base64.RawStdEncoding.EncodeToString(ed25519.Sign(key, signed(data)))
}

// VerifyJob reports whether sig is a signature of data under pub.
func VerifyJob(pub ed25519.PublicKey, data []byte, sig string) bool {
	raw, err := base64.RawStdEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize || len(pub) != ed25519.PublicKeySize {
		return false
	}
	return ed25519.Verify(pub, signed(data), raw)
}
