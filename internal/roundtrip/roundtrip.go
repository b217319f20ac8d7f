// Package roundtrip counts network round trips between pgx and PostgreSQL,
// for tests and benchmarks that must prove a call costs N trips.
//
// A round trip is counted each time the client starts writing after it has
// read from the server (or writes for the first time): a pipelined batch
// written in several Write calls before any reply is read counts once.
// Install [Counter.DialFunc] as pgconn.Config.DialFunc.
package roundtrip

import (
	"context"
	"net"
	"sync/atomic"
	"time"
)

// Counter counts round trips over every connection it dialed. The zero
// value is ready to use and safe for concurrent use.
type Counter struct {
	n         atomic.Int64
	deadlines atomic.Int64
}

// DialFunc dials like net.Dialer and wraps the connection so that its
// traffic is counted. Its signature matches pgconn.DialFunc.
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

// Deadlines returns how many deadlines in the future were set on the
// connections it dialed (SetDeadline, SetReadDeadline, SetWriteDeadline),
// and sets that count to zero. Each such deadline arms one of the Go
// runtime's timers; clearing a deadline, or setting one in the past, is
// not counted.
func (c *Counter) Deadlines() int64 { return c.deadlines.Swap(0) }

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

func (cn *conn) count(t time.Time) {
	if !t.IsZero() && t.After(time.Now()) {
		cn.c.deadlines.Add(1)
	}
}

func (cn *conn) SetDeadline(t time.Time) error {
	cn.count(t)
	return cn.Conn.SetDeadline(t)
}

func (cn *conn) SetReadDeadline(t time.Time) error {
	cn.count(t)
	return cn.Conn.SetReadDeadline(t)
}

func (cn *conn) SetWriteDeadline(t time.Time) error {
	cn.count(t)
	return cn.Conn.SetWriteDeadline(t)
}

// NetConn returns the connection it wraps, as crypto/tls's Conn does, so
// that code reading the socket's state (pooltx's count of bytes written)
// finds it. The wrapper does not buffer.
func (cn *conn) NetConn() net.Conn { return cn.Conn }
