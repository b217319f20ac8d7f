// Package tcpproxy is a loopback TCP proxy for fault tests: it forwards connections to a
// server and can cut them silently (a network partition: sockets stay open, no byte
// arrives either way), then close what it cut (the partition ends in a reset). The
// advisory fault suites and the soak command (advisory_test/soak) share it.
package tcpproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a server, and can cut the
// connections it carries without closing them: a silent network partition, as seen from
// both ends (sockets open, nothing arrives). Every goroutine it starts ends by Close.
type Proxy struct {
	ln net.Listener

	mu              sync.Mutex
	network, target string // where new connections go
	links           map[*link]struct{}
	closed          bool
	wg              sync.WaitGroup

	clientBytes atomic.Int64           // forwarded from clients to the server
	dropNext    atomic.Bool            // DropNextAnswer armed: the next server bytes are dropped
	swallow     atomic.Pointer[[]byte] // Swallow's pattern; nil: none
	swallowed   atomic.Int64           // reads Swallow dropped
	delay       atomic.Pointer[delay]  // Delay's pattern and time; nil: none
	delayed     atomic.Int64           // reads Delay held
}

// delay is what Delay holds and for how long.
type delay struct {
	pattern []byte
	d       time.Duration
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	cut            atomic.Bool // drop every byte, both ways, keep the sockets open
	once           sync.Once
	closed         chan struct{} // closed by close
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
		close(l.closed)
	})
}

// New listens on a free port of 127.0.0.1 and forwards every connection it accepts to
// network/target ("tcp" and "host:port", or "unix" and a socket path). Close it when done.
func New(network, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: %w", err)
	}
	p := &Proxy{ln: ln, network: network, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Port returns the port the proxy listens on, on 127.0.0.1.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		network, target := p.network, p.target
		p.mu.Unlock()
		s, err := net.Dial(network, target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s, closed: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2) // under mu, before Close can Wait
		p.mu.Unlock()
		go p.pump(l, l.server, l.client, &p.clientBytes, false)
		go p.pump(l, l.client, l.server, nil, true)
	}
}

// pump copies src to dst until either side fails, dropping the bytes while the link is
// cut; then it closes both sides, which ends the other pump. fromServer marks the pump of
// what the server sends, which an armed DropNextAnswer ends.
func (p *Proxy) pump(l *link, dst, src net.Conn, count *atomic.Int64, fromServer bool) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && fromServer && p.dropNext.CompareAndSwap(true, false) {
			return // the deferred close ends both sides; the bytes never reach the client
		}
		if n > 0 && !fromServer {
			if pat := p.swallow.Load(); pat != nil && bytes.Contains(buf[:n], *pat) {
				p.swallowed.Add(1)
				continue // swallowed: the server never sees it, nor answers
			}
			if dl := p.delay.Load(); dl != nil && bytes.Contains(buf[:n], dl.pattern) {
				p.delayed.Add(1)
				time.Sleep(dl.d) // a slow network for this request: what follows waits behind it
			}
		}
		if n > 0 && !l.cut.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if count != nil {
				count.Add(int64(n))
			}
		}
		if err != nil {
			if l.cut.Load() {
				// A partition does not carry a close either (the client
				// closing its socket, say): the other end stays open until
				// CloseCut or Close.
				<-l.closed
			}
			return
		}
	}
}

// SetTarget sends the connections accepted from now on to network/target (a failover
// to another server); connections open now keep their server.
func (p *Proxy) SetTarget(network, target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.network, p.target = network, target
}

// DropNextAnswer arms the proxy once: the next bytes any server sends through it are
// dropped and that connection closed, both sides, as a network that fails after a request
// left the client would. The server has run what it was sent; the client never hears how
// it went.
func (p *Proxy) DropNextAnswer() { p.dropNext.Store(true) }

// Swallow drops, from now on, every read of client bytes that contains pattern (a
// statement's text, say), keeping the connection open: a server, or a network, that goes
// silent for that request alone. What the client sends next is forwarded again, and the
// server, which never saw the request, answers that. Swallow(nil) ends it. A pattern split
// across two reads is not seen.
func (p *Proxy) Swallow(pattern []byte) {
	if pattern == nil {
		p.swallow.Store(nil)
		return
	}
	pat := bytes.Clone(pattern)
	p.swallow.Store(&pat)
}

// Delay holds, from now on, every read of client bytes that contains pattern for d before
// forwarding it (what the client sends after it waits behind it, in order): a request, or
// a network, slow for that request alone, so that its answer comes late. Delay(nil, 0)
// ends it. A pattern split across two reads is not seen.
func (p *Proxy) Delay(pattern []byte, d time.Duration) {
	if pattern == nil {
		p.delay.Store(nil)
		return
	}
	p.delay.Store(&delay{pattern: bytes.Clone(pattern), d: d})
}

// Delayed returns how many client reads Delay has held.
func (p *Proxy) Delayed() int64 { return p.delayed.Load() }

// Swallowed returns how many client reads Swallow has dropped.
func (p *Proxy) Swallowed() int64 { return p.swallowed.Load() }

// AnswerDropped reports whether the drop DropNextAnswer armed has happened.
func (p *Proxy) AnswerDropped() bool { return !p.dropNext.Load() }

// ClientBytes returns how many bytes clients have sent through the proxy.
func (p *Proxy) ClientBytes() int64 { return p.clientBytes.Load() }

// Cut silences every connection open now: bytes are read and dropped both ways, the
// sockets stay open. New connections are forwarded normally. It returns how many
// connections it cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.cut.Store(true)
	}
	return len(p.links)
}

// CloseCut closes the connections Cut silenced, as a partition that ends in a reset
// would: the server then sees its sessions end.
func (p *Proxy) CloseCut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.cut.Load() {
			l.close()
		}
	}
}

// Close stops accepting, closes every connection and waits for the goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	_ = p.ln.Close() // a second Close returns net.ErrClosed: nothing to do
	p.wg.Wait()
}
