package mcpserver

import (
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/server"
)

// TestEndedSessionIsGone: a session its client ended (DELETE) answers 404
// afterwards, as the transport asks; another tenant's DELETE of it is
// refused and ends nothing.
func TestEndedSessionIsGone(t *testing.T) {
	s := server.NewMCPServer("t", "0")
	hs := httptest.NewServer(Handler(s, HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"alice-token-1": "alice", "bob-token-12": "bob"}})}))
	defer hs.Close()
	_, sid, body := mcpPost(t, hs.URL, "alice-token-1", "", initialize)
	if sid == "" {
		t.Fatalf("initialize: %s", body)
	}
	del := func(token string) int {
		req, _ := http.NewRequest(http.MethodDelete, hs.URL+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(server.HeaderKeySessionID, sid)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close() // the status is what matters
		return resp.StatusCode
	}
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if code := del("bob-token-12"); code != http.StatusNotFound {
		t.Fatalf("bob ends alice's session: %d", code)
	}
	if code, _, body := mcpPost(t, hs.URL, "alice-token-1", sid, ping); code != http.StatusOK {
		t.Fatalf("alice's session after bob's DELETE: %d %s", code, body)
	}
	if code := del("alice-token-1"); code/100 != 2 {
		t.Fatalf("alice ends her session: %d", code)
	}
	if code, _, body := mcpPost(t, hs.URL, "alice-token-1", sid, ping); code != http.StatusNotFound {
		t.Fatalf("alice's ended session: %d %s", code, body)
	}
	// A new session still opens.
	if code, sid2, body := mcpPost(t, hs.URL, "alice-token-1", "", initialize); code != http.StatusOK || sid2 == sid {
		t.Fatalf("initialize after the end: %d %q %s", code, sid2, body)
	}
}

// TestEndedSessionsAreBounded: a client ending sessions without end fills
// no memory: the oldest ended are forgotten past maxEnded.
func TestEndedSessionsAreBounded(t *testing.T) {
	ids := newSessionIDs(nil)
	n := nsSessions{ids: ids, ns: "alice"}
	first := n.Generate()
	if _, err := n.Terminate(first); err != nil {
		t.Fatal(err)
	}
	for i := range maxEnded + 10 {
		if _, err := n.Terminate(n.Generate()); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if len(ids.ended) != maxEnded || len(ids.order) != maxEnded {
		t.Fatalf("remembers %d (%d in order), want %d", len(ids.ended), len(ids.order), maxEnded)
	}
	if ended, _ := n.Validate(first); ended {
		t.Fatal("the oldest ended session is still remembered")
	}
	if _, err := (nsSessions{ids: ids, ns: "bob"}).Terminate(first); err == nil || !strings.Contains(err.Error(), "unknown session") {
		t.Fatalf("bob ends alice's session: %v", err)
	}
}
