package jobs

import (
	"bytes"
	"testing"
)

// TestOutputProofBindsEveryField: a chunk's proof checks only for its own
// job, attempt, sequence number, stream and data, under its job's capability.
func TestOutputProofBindsEveryField(t *testing.T) {
	key := bytes.Repeat([]byte{1}, CapabilityKeySize)
	capability := Capability(key, "a/j1")
	c := OutputChunk{Stream: "stdout", Data: "hi\n", Attempt: 1, Seq: 3}
	c.Proof = OutputProof(capability, "a/j1", c)
	if !CheckOutput(capability, "a/j1", c) {
		t.Fatal("a genuine chunk does not check")
	}
	for name, change := range map[string]func(*OutputChunk){
		"stream":  func(c *OutputChunk) { c.Stream = "stderr" },
		"data":    func(c *OutputChunk) { c.Data = "hj\n" },
		"attempt": func(c *OutputChunk) { c.Attempt = 2 },
		"seq":     func(c *OutputChunk) { c.Seq = 4 },
		"proof":   func(c *OutputChunk) { c.Proof = "" },
	} {
		d := c
		change(&d)
		if CheckOutput(capability, "a/j1", d) {
			t.Errorf("a chunk with another %s checks", name)
		}
	}
	if CheckOutput(capability, "a/j2", c) || CheckOutput(Capability(key, "a/j2"), "a/j1", c) || CheckOutput("", "a/j1", c) {
		t.Fatal("a chunk checks for another job or capability")
	}
}

// TestSessionProofBindsSessionAndWorker: an entry's proof checks only for its
// session and worker, under that session's capability.
func TestSessionProofBindsSessionAndWorker(t *testing.T) {
	key := bytes.Repeat([]byte{1}, CapabilityKeySize)
	c1 := SessionCapability(key, "a.s1")
	p := SessionProof(c1, "a.s1", "w1")
	if !CheckSessionProof(c1, "a.s1", "w1", p) {
		t.Fatal("a genuine entry does not check")
	}
	c2 := SessionCapability(key, "a.s2")
	if c1 == c2 || CheckSessionProof(c1, "a.s1", "w2", p) || CheckSessionProof(c1, "a.s2", "w1", p) ||
		CheckSessionProof(c2, "a.s1", "w1", p) || CheckSessionProof("", "a.s1", "w1", p) || CheckSessionProof(c1, "a.s1", "w1", "") {
		t.Fatal("an entry checks for another session, worker or capability")
	}
	if SessionCapability(bytes.Repeat([]byte{2}, CapabilityKeySize), "a.s1") == c1 {
		t.Fatal("two proxy keys give a session the same capability")
	}
}
