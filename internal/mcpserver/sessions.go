package mcpserver

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"net/http"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/server"
)

// MCP sessions over HTTP are bound to the namespace that opened them: a
// session id is "mcp-session-<uuid>.<tag>", the tag an HMAC of the uuid and
// the namespace under a key. A request that carries another namespace's
// session id (taken from a log, or guessed) is refused as an unknown session,
// so it can neither read that session's notifications nor send it any (the
// task layer's status watchers check the same way). Nothing is stored: any
// front-end given the same key accepts the session, as before.

const sessionPrefix = "mcp-session-"

// sessionIDs resolves, per request, a session id manager bound to the
// request's namespace. It remembers the sessions its clients ended (DELETE),
// the last maxEnded of them, so that this front-end answers a request in an
// ended session with 404 as the transport asks; another front-end given the
// same key does not know of the end.
type sessionIDs struct {
	key []byte

	mu    sync.Mutex
	ended map[string]struct{}
	order []string // ended, oldest first
}

// maxEnded bounds the ended sessions a front-end remembers.
const maxEnded = 4096

func newSessionIDs(key []byte) *sessionIDs {
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // never fails (crypto/rand)
	}
	return &sessionIDs{key: key, ended: map[string]struct{}{}}
}

// end records that session was ended.
func (s *sessionIDs) end(session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ended[session]; ok {
		return
	}
	if len(s.order) >= maxEnded {
		delete(s.ended, s.order[0])
		s.order = s.order[1:]
	}
	s.ended[session] = struct{}{}
	s.order = append(s.order, session)
}

// isEnded reports whether session was ended here.
func (s *sessionIDs) isEnded(session string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ended[session]
	return ok
}

func (s *sessionIDs) tag(ns, id string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("mcpexec-mcp-session/v1\x00"))
	m.Write([]byte(ns))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// owns reports whether session id was opened by namespace ns.
func (s *sessionIDs) owns(ns, session string) bool {
	rest, ok := strings.CutPrefix(session, sessionPrefix)
	if !ok {
		return false
	}
	id, tag, ok := strings.Cut(rest, ".")
	if !ok || uuid.Validate(id) != nil {
		return false
	}
	return hmac.Equal([]byte(tag), []byte(s.tag(ns, id)))
}

// ResolveSessionIdManager implements server.SessionIdManagerResolver.
func (s *sessionIDs) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	return nsSessions{ids: s, ns: httpauth.Namespace(r.Context())}
}

// sessionOwned reports whether the request's session id (if any) is its
// namespace's.
func (s *sessionIDs) sessionOwned(ctx context.Context, session string) bool {
	return s.owns(httpauth.Namespace(ctx), session)
}

type nsSessions struct {
	ids *sessionIDs
	ns  string
}

var errForeignSession = errors.New("unknown session: open one with initialize")

func (n nsSessions) Generate() string {
	id := uuid.NewString()
	return sessionPrefix + id + "." + n.ids.tag(n.ns, id)
}

func (n nsSessions) Validate(session string) (bool, error) {
	if !n.ids.owns(n.ns, session) {
		return false, errForeignSession
	}
	return n.ids.isEnded(session), nil
}

func (n nsSessions) Terminate(session string) (bool, error) {
	if !n.ids.owns(n.ns, session) {
		return false, errForeignSession
	}
	n.ids.end(session)
	return false, nil
}
