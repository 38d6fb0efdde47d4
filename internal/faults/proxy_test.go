package faults_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// proxy forwards TCP connections to one node (its route or client
// listener). It can hold traffic (a paused process: connections stay open
// and nothing moves) and cut the links of chosen peers (a partition: their
// connections are closed and new ones refused).
type proxy struct {
	ln    net.Listener
	route bool // route links: learn the dialing server from its CONNECT

	mu     sync.Mutex               // guards the fields below
	target string                   // host:port forwarded to ("": not yet known, refuse)
	held   bool                     // every link held
	holdOf string                   // links of this dialer held ("": none)
	cut    func(dialer string) bool // links to refuse, by the dialing server's id ("" for clients)
	links  map[*link]struct{}
	wake   *sync.Cond // signalled when held ends or the proxy closes
	closed bool

	wg sync.WaitGroup
}

// link is one forwarded connection.
type link struct {
	a, b   net.Conn
	dialer string // the dialing server's id, for route links
}

func newProxy(t *testing.T, route bool) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, route: route, links: map[*link]struct{}{}}
	p.wake = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setTarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
}

// hold stops (true) or resumes (false) all traffic through the proxy.
func (p *proxy) hold(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = on
	p.wake.Broadcast()
}

// holdFrom holds (true) or resumes the links that server id dialed.
func (p *proxy) holdFrom(id string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdOf = ""
	if on {
		p.holdOf = id
	}
	p.wake.Broadcast()
}

// isHeld reports whether l's traffic waits; p.mu must be held.
func (p *proxy) isHeld(l *link) bool {
	return !p.closed && (p.held || (p.holdOf != "" && l.dialer == p.holdOf))
}

// partition closes the links whose dialer cut selects, and refuses new
// ones, until heal; nil heals.
func (p *proxy) partition(cut func(dialer string) bool) {
	p.mu.Lock()
	p.cut = cut
	p.wake.Broadcast()
	var drop []*link
	for l := range p.links {
		if cut != nil && cut(l.dialer) {
			drop = append(drop, l)
		}
	}
	p.mu.Unlock()
	for _, l := range drop {
		l.close()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.held = false
	p.wake.Broadcast()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	_ = p.ln.Close() // ends accept
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}

func (l *link) close() {
	_ = l.a.Close() // either end may be closed already
	_ = l.b.Close()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

// serve forwards c to the target until either end closes.
func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	if target == "" {
		_ = c.Close() // the node is not up yet: the dialer retries
		return
	}
	s, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		_ = c.Close() // the node is down: the dialer retries
		return
	}
	l := &link{a: c, b: s}
	from := io.Reader(c)
	if p.route {
		// The dialing server speaks first: CONNECT {"name": "<server id>", ...}.
		br := bufio.NewReaderSize(c, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadSlice('\n')
		_ = c.SetReadDeadline(time.Time{})
		if err != nil {
			l.close()
			return
		}
		var connect struct {
			Name string `json:"name"`
		}
		if js, ok := bytes.CutPrefix(line, []byte("CONNECT ")); ok {
			_ = json.Unmarshal(bytes.TrimSpace(js), &connect) // not a route: no dialer
		}
		l.dialer = connect.Name
		if _, err := s.Write(line); err != nil {
			l.close()
			return
		}
		from = br
	}
	p.mu.Lock()
	if p.closed || (p.cut != nil && p.cut(l.dialer)) {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.close()
	}()
	done := make(chan struct{}, 2)
	go func() { p.copy(l, s, from); done <- struct{}{} }()
	go func() { p.copy(l, c, s); done <- struct{}{} }()
	<-done
	l.close()
	<-done
}

// copy moves bytes from src to dst, waiting while the proxy holds traffic.
func (p *proxy) copy(l *link, dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.isHeld(l) && (p.cut == nil || !p.cut(l.dialer)) {
				p.wake.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
