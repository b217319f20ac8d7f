// Package rt counts network round trips between a client and its server.
//
// It is a copy of the main module's internal/roundtrip (Go's internal rule
// keeps bench, a separate module, from importing it). A round trip is
// counted each time the client starts writing after it has read from the
// server (or writes for the first time): a pipelined batch written in several
// Write calls before any reply is read counts once.
package rt

import (
	"context"
	"net"
	"sync/atomic"
)

// Counter counts round trips over every connection it dialed. The zero value
// is ready to use and safe for concurrent use.
type Counter struct {
	n atomic.Int64
}

// DialFunc dials like net.Dialer and wraps the connection so that its traffic
// is counted. Its signature matches pgconn.DialFunc and go-redis's Dialer.
func (c *Counter) DialFunc(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: nc, c: c}, nil
}

// Count returns the round trips counted so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// Reset sets the count to zero and returns the count it had.
func (c *Counter) Reset() int64 { return c.n.Swap(0) }

type conn struct {
	net.Conn
	c *Counter
	// writing is true from the first Write of a burst until bytes arrive
	// from the server.
	writing atomic.Bool
}

func (cn *conn) Write(p []byte) (int, error) {
	if !cn.writing.Swap(true) {
		cn.c.n.Add(1)
	}
	return cn.Conn.Write(p)
}

func (cn *conn) Read(p []byte) (int, error) {
	n, err := cn.Conn.Read(p)
	if n > 0 {
		cn.writing.Store(false)
	}
	return n, err
}

// NetConn returns the connection it wraps, as crypto/tls's Conn does, so
// that code reading the socket's state (pgxlock's pooltx counts the bytes
// written to it) finds it. The wrapper does not buffer.
func (cn *conn) NetConn() net.Conn { return cn.Conn }
