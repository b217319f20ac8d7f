package pooltx

// Whether lent code sent anything.
//
// A connection lent to code the caller does not control ([Conn.Lend]) is
// reset before it goes back to the pool, because that code may have changed
// the session. Code that sent nothing to the server cannot have: a
// session's state changes only by statements the client sends. So Lend
// notes how many bytes the kernel has taken for the connection's socket
// (on Linux over TCP, TLS included: TCP_INFO's tcpi_bytes_sent, which
// counts retransmissions too, plus tcpi_notsent_bytes, what is queued
// but not yet sent), and [Conn.Reclaim] compares after the code returned:
// equal means nothing was written, and no reset is needed. Bytes handed to
// pgx's frontend but not flushed are flushed first, so they count. Where
// the count cannot be read (another OS, a Unix-domain socket, a DialFunc
// whose net.Conn does not unwrap to a *net.TCPConn by NetConn methods),
// the reset always runs.

// meterKey is the key of a connection's *meter in pgconn's per-connection
// CustomData.
const meterKey = "pgxlock/pooltx.meter"

// unmeasured is the meter of a connection whose count cannot be read.
var unmeasured = &meter{}

// meter returns the byte meter of c's socket, made on first use.
func (c *Conn) meter() *meter {
	pg := c.conn.PgConn()
	data := pg.CustomData()
	if m, ok := data[meterKey].(*meter); ok {
		return m
	}
	m := newMeter(pg.Conn())
	if m == nil {
		m = unmeasured
	}
	data[meterKey] = m
	return m
}

// markSent notes the socket's count for Reclaim.
func (c *Conn) markSent() {
	c.mark, c.marked = c.meter().sent()
}

// Reclaim records that the code c was lent to ([Conn.Lend]) has returned,
// and reports whether that code sent nothing on the connection: where the
// kernel's count of bytes written to the connection's socket can be read
// (Linux, over TCP, TLS included), it is compared with the count Lend
// noted, after flushing whatever that code handed pgx's frontend without
// flushing. Equal means no statement reached the server: the session is as
// it was when lent, and c counts as never lent ([Conn.Lent] reports false),
// so that its release runs no reset on that code's account. Anywhere else,
// or when anything was written, c stays lent. A failed flush marks c
// dirty. Nothing else may have used the connection since Lend (a
// goroutine the code started must not use it after the code returned);
// a net.Conn of a custom DialFunc that unwraps by a NetConn method must
// not buffer writes.
func (c *Conn) Reclaim() (quiet bool) {
	if !c.lent || !c.marked || c.dirty != nil || c.conn.IsClosed() {
		return false
	}
	c.marked = false
	pg := c.conn.PgConn()
	if pg.IsBusy() {
		return false
	}
	c.BoundCleanup()
	err := pg.Frontend().Flush() // writes nothing when nothing is buffered
	c.EndBound()
	if err != nil {
		c.MarkDirty(&CleanupError{Step: "reclaim", Err: err})
		return false
	}
	n, ok := c.meter().sent()
	if !ok || n != c.mark {
		return false
	}
	c.lent = false
	return true
}
