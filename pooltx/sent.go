package pooltx

import (
	"errors"
	"time"
)

// Whether lent code left the connection as it found it.
//
// A connection lent to code the caller does not control ([Conn.Lend]) is
// reset before it goes back to the pool, because that code may have changed
// the session. Code that sent nothing to the server cannot have: a
// session's state changes only by statements the client sends. So Lend
// notes the kernel's counts for the connection's socket (on Linux over
// TCP, TLS included: TCP_INFO's tcpi_bytes_sent, which counts
// retransmissions too, plus tcpi_notsent_bytes, what is queued but not yet
// sent; tcpi_bytes_received; the TCP state), and [Conn.Reclaim] compares
// after the code returned: nothing written, nothing received, nothing
// waiting to be read (a peek, MSG_PEEK|MSG_DONTWAIT, that also sees a read
// side shut) and still established means no reset is needed. Bytes handed to pgx's frontend but
// not flushed are flushed first, so they count; a deadline left on the
// socket is cleared. Where the counts cannot be read (another OS, a
// Unix-domain socket, a DialFunc whose net.Conn does not unwrap to a
// *net.TCPConn by NetConn methods), the reset always runs.

// errReadEnded: Reclaim found the connection's read side over.
var errReadEnded = errors.New("the connection's read side has ended")

// unmeasured is the meter of a connection whose count cannot be read.
var unmeasured = &meter{}

// meter returns the byte meter of c's socket, made on first use.
func (c *Conn) meter() *meter {
	st := c.state()
	if st.meter == nil {
		st.meter = newMeter(c.conn.PgConn().Conn())
		if st.meter == nil {
			st.meter = unmeasured
		}
	}
	return st.meter
}

// traffic is what the kernel has counted on a socket (see meter).
type traffic struct {
	written, received uint64
	established       bool
}

// markSent notes the socket's counts for Reclaim.
func (c *Conn) markSent() {
	c.mark, c.marked = c.meter().traffic()
	c.marked = c.marked && c.mark.established
}

// Reclaim records that the code c was lent to ([Conn.Lend]) has returned,
// and reports whether that code, and everything lent c since its last
// reset, left the connection as it found it: where the kernel's counts for
// the connection's socket can be read (Linux, over TCP, TLS included), they
// are compared with those noted by the Lend that began the lending (the
// pin's first, or the first since Reclaim last found c quiet), after
// flushing whatever that code handed pgx's frontend without flushing, and
// after clearing any deadline it set on the socket. Quiet means no byte
// was written (no statement reached the server), none was received and
// none waits to be read (nothing from the server has arrived: not a
// notice, a notification or the error of a session it ended), and the
// connection is open both ways (no FIN sent or received, no read side
// shut): the session is as it was when lent, and c counts as never lent ([Conn.Lent] reports
// false), so that its release runs no reset on that code's account.
// Anywhere else, or when anything moved, c stays lent, and a later Lend or
// Reclaim does not undo that until the reset has run. (A session the
// server ends while its last words are still on the way is not seen: the
// next borrower then finds it ended, as it would find an idle connection
// of the pool whose session ended; pgxpool pings a connection idle for
// over a second before it hands it out.) A failed flush marks
// c dirty. Whether or not the code was quiet, and wherever the counts can
// be read or not, Reclaim clears a deadline it left on the socket, and,
// where the counts can be read, marks c dirty when it finds the socket's
// read side over (shut down, or ended by the server with nothing before
// its FIN): the connection is destroyed rather than reset, since no answer
// on it can be relied on. (Elsewhere, a Unix-domain socket say, such a
// connection is destroyed by the reset that then runs, which reads the
// end of the stream.) Nothing else may have used the connection since Lend (a
// goroutine the code started must not use it after the code returned); a
// net.Conn of a custom DialFunc that unwraps by a NetConn method must not
// buffer writes.
func (c *Conn) Reclaim() (quiet bool) {
	defer func() { c.quiet = quiet }()
	if !c.lent || c.dirty != nil || c.conn.IsClosed() {
		return false
	}
	marked := c.marked
	c.marked = false // from here on c stays lent unless found quiet now
	pg := c.conn.PgConn()
	if pg.IsBusy() {
		return false
	}
	// Whatever the lent code sent: a deadline it left on the socket must
	// not outlive it (a fresh connection has none), and a read side it
	// shut (or that the server's FIN with nothing before it ended) makes
	// every later answer unreliable, the reset's included: after
	// shutdown(SHUT_RD) Linux still delivers what arrives before a read
	// asks, so a reset could seem to succeed.
	if err := pg.Conn().SetDeadline(time.Time{}); err != nil {
		c.MarkDirty(&CleanupError{Step: "reclaim", Err: err})
		return false
	}
	m := c.meter()
	empty := m.nothingToRead()
	if !empty && m.readEnded() {
		c.MarkDirty(&CleanupError{Step: "reclaim", Err: errReadEnded})
		return false
	}
	if !marked {
		return false
	}
	c.BoundCleanup()
	err := pg.Frontend().Flush() // writes nothing when nothing is buffered
	c.EndBound()
	if err != nil {
		c.MarkDirty(&CleanupError{Step: "reclaim", Err: err})
		return false
	}
	n, ok := m.traffic()
	if !ok || n != c.mark || !empty {
		return false
	}
	c.lent = false
	return true
}
