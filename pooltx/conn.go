package pooltx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/cutoff"
)

// DefaultCleanupTimeout bounds every cleanup step (rollback, unlock, reset,
// closing a destroyed connection) when no other timeout is configured.
const DefaultCleanupTimeout = 5 * time.Second

// ConnOptions are per-call options for [Acquire] and [WithConn]. A nil
// *ConnOptions means the defaults.
type ConnOptions struct {
	// CleanupTimeout bounds each cleanup step run on the connection after
	// the work. Zero means DefaultCleanupTimeout.
	CleanupTimeout time.Duration

	// DeferIdentity vouches that the caller sends nothing that changes the
	// session's identity (SET ROLE, SET SESSION AUTHORIZATION,
	// set_config('role', ...)) on the connection before it lends it
	// ([Conn.Lend]) or releases it. The connection's identity is then
	// recorded by its first Lend rather than by [Acquire] (which saves
	// Acquire's round trip on a connection's first pin), and a reset
	// before any Lend recorded one leaves identity as it is. Package
	// advisory and package lease set it: their own statements change no
	// identity.
	DeferIdentity bool
}

func (o *ConnOptions) cleanupTimeout() time.Duration {
	if o == nil || o.CleanupTimeout <= 0 {
		return DefaultCleanupTimeout
	}
	return o.CleanupTimeout
}

// CleanupContext returns a context for a cleanup step: it keeps ctx's values
// but not its cancellation or deadline, and ends after timeout (or
// DefaultCleanupTimeout when timeout <= 0). Callers use it for unlock, reset
// and release statements that must run even when the caller has given up.
func CleanupContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		timeout = DefaultCleanupTimeout
	}
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// Conn is one connection pinned from a pool. It is owned by a single
// goroutine at a time and must end with [Conn.Release], which returns the
// connection to the pool only when it is known to be clean and destroys it
// otherwise.
type Conn struct {
	pc      *pgxpool.Conn
	conn    *pgx.Conn
	timeout time.Duration
	dirty   error
	clean   bool    // the session is known to be as the pool gave it: Release skips the reset
	lent    bool    // handed to code the caller does not control (Lend), and not found quiet since (Reclaim)
	wasLent bool    // lent at any time during the pin: queued notifications are dropped at release...
	quiet   bool    // ...unless the last Reclaim found c quiet (nothing received: nothing queued)
	txClean bool    // c.clean when Tx began: what a COMMIT or ROLLBACK without the reset leaves
	marked  bool    // mark holds the socket's counts at the Lend that began the lending (Reclaim)
	mark    traffic // see meter

	// The batch that begins a transaction ([Conn.Tx]), kept here so that
	// a transaction allocates neither it nor, for up to len(queued)
	// statements, its queue.
	batch  pgx.Batch
	queued [4]*pgx.QueuedQuery

	query pgproto3.Query // the reset's message (resetBounded), kept here: no allocation
	bound cutoff.Bound   // the cleanup bound in progress (BoundCleanup)

	deferIdentity   bool       // ConnOptions.DeferIdentity
	unknownIdentity bool       // first lent inside the caller's transaction: no identity recorded to return to (Release destroys c while lent)
	st              *connState // the connection's state, once looked up (state)
}

// BoundCleanup bounds what runs on c from now until [Conn.EndBound] by the
// cleanup timeout, as a deadline on the socket would: a read or write
// still blocked when the timeout has passed fails, and pgx closes the
// connection (Release then destroys it). Unlike a deadline set on the
// socket for each step, it arms no runtime timer of its own (one timer
// shared by the whole process serves every bound), so that a step that
// ends in time costs neither a timer nor the wake-up of Go's network
// poller that arming one causes. ctx-free steps of the caller's own
// (an unlock, a rollback) use it; it must not be nested.
func (c *Conn) BoundCleanup() { c.bound.Start(c.conn.PgConn().Conn(), c.timeout) }

// EndBound ends the bound of [Conn.BoundCleanup]; idempotent. If the
// timeout had passed, the socket's deadline, which was cut, is cleared
// again.
func (c *Conn) EndBound() { c.bound.End() }

// Acquire pins one connection of pool. ctx governs only the wait for a
// connection. On a connection's first pin (once in its life) Acquire also
// records the session's identity, session_user and role, in one round
// trip bounded by the cleanup timeout and ctx's deadline, whichever comes
// first (and, where pgx's statement cache is
// in use, prepares the reset's probe in the same one), so that every
// later reset returns to that identity, one set in pgxpool's AfterConnect
// included, and undoes what the caller's own statements changed;
// [ConnOptions.DeferIdentity] defers this to the first [Conn.Lend]. If
// that read fails, the connection is destroyed and Acquire returns the
// error (with ctx's, where ctx ended). The caller must call
// [Conn.Release] exactly once (more calls are harmless).
func Acquire(ctx context.Context, pool *pgxpool.Pool, opts *ConnOptions) (*Conn, error) {
	if pool == nil {
		return nil, errors.New("pooltx: nil pool")
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pooltx: acquire connection: %w", err)
	}
	c := &Conn{pc: pc, conn: pc.Conn(), timeout: opts.cleanupTimeout(), deferIdentity: opts != nil && opts.DeferIdentity}
	if !c.deferIdentity && c.baseline() == nil {
		within := c.timeout
		if d, ok := ctx.Deadline(); ok && time.Until(d) < within {
			within = max(time.Until(d), time.Millisecond)
		}
		if err := c.recordBaselineGuarded(within); err != nil {
			c.Release() // destroys it
			if cerr := ctx.Err(); cerr != nil {
				return nil, fmt.Errorf("pooltx: acquire connection: %w: %w", err, cerr)
			}
			return nil, fmt.Errorf("pooltx: acquire connection: %w", err)
		}
	}
	return c, nil
}

// Conn returns the underlying connection. It must not be used after
// Release, and must not be closed or handed to another goroutine that
// outlives the work.
func (c *Conn) Conn() *pgx.Conn { return c.conn }

// CleanupTimeout is the bound applied to each cleanup step on c.
func (c *Conn) CleanupTimeout() time.Duration { return c.timeout }

// MarkDirty records that the connection may hold state that must not reach
// the next borrower (a lock whose release is uncertain, a setting, an
// unknown outcome). A dirty connection is destroyed by Release. The first
// reason is kept; reason nil is replaced by a generic one.
func (c *Conn) MarkDirty(reason error) {
	if c.dirty != nil {
		return
	}
	if reason == nil {
		reason = errors.New("pooltx: marked dirty")
	}
	c.dirty = reason
}

// Dirty returns the reason the connection was marked dirty, or nil.
func (c *Conn) Dirty() error { return c.dirty }

// Release ends the pin. A connection that is open, not busy, outside any
// transaction (TxStatus 'I') and not marked dirty is reset ([Conn.Reset]:
// identity, settings and session state restored, session-level advisory
// locks dropped, one round trip bounded by the cleanup timeout) unless that
// has already been done or the caller vouched for it ([Conn.MarkClean]),
// and goes back to the pool; any other, and one whose reset fails, is
// hijacked out of the pool and closed, so the server ends its session and
// every lock it held. Release is idempotent and reports whether the
// connection was destroyed.
func (c *Conn) Release() (destroyed bool) {
	if c.pc == nil {
		return false
	}
	pg := c.conn.PgConn()
	if c.unknownIdentity && c.lent && c.dirty == nil {
		// First lent inside the caller's transaction, and not found quiet
		// since: no reset can tell which identity to return to.
		c.MarkDirty(errUnknownIdentity)
	}
	if c.dirty == nil && !c.clean && !c.conn.IsClosed() && !pg.IsBusy() && pg.TxStatus() == 'I' {
		c.releaseReset()
	}
	pc := c.pc
	c.pc = nil
	if c.wasLent && c.dirty == nil && !c.conn.IsClosed() {
		// A deadline lent code left on the socket (a batch's reader, say,
		// which no Reclaim follows) must not reach the next borrower.
		if err := pg.Conn().SetDeadline(time.Time{}); err != nil {
			c.MarkDirty(&CleanupError{Step: "release", Err: err})
		}
	}
	if c.dirty == nil && !c.conn.IsClosed() && !pg.IsBusy() && pg.TxStatus() == 'I' {
		if c.wasLent && !c.quiet {
			dropNotifications(c.conn)
		}
		pc.Release()
		return false
	}
	raw := pc.Hijack()
	closeNow(raw, c.timeout)
	return true
}

// recordBaselineGuarded is Acquire's recordBaseline. A panic out of it (the
// pool's OnNotice, say, called while the answers are read; recordBaseline
// has marked c dirty) destroys the connection, which gives its slot back to
// the pool, before it goes on up: nothing else holds the connection yet.
func (c *Conn) recordBaselineGuarded(within time.Duration) error {
	done := false
	defer func() {
		if !done {
			c.Release()
		}
	}()
	err := c.recordBaseline(within)
	done = true
	return err
}

// releaseReset runs Release's reset. A panic out of it (the pool's
// OnNotice, say, called while the answers are read) destroys the
// connection, which gives its slot back to the pool, before it goes on up.
func (c *Conn) releaseReset() {
	done := false
	defer func() {
		if !done {
			c.MarkDirty(errors.New("pooltx: the reset panicked"))
			pc := c.pc
			c.pc = nil
			closeNow(pc.Hijack(), c.timeout)
		}
	}()
	c.resetBounded()
	done = true
}

// closeNow closes a connection that must not be reused so that its backend
// exits, and its locks go, as soon as the server reads the socket.
//
// A connection pgx has not closed yet gets pgx's own close (Terminate,
// then the socket), bounded by timeout. One that pgx has already given up
// on (a context that ended mid-statement, a read that failed) is being
// closed by pgx in the background, which first sends a cancel request on a
// new connection (a TCP connect, over TLS a handshake too, and the
// postmaster's fork: 85-500 ms each on a loaded 2-core machine, and a
// backend of the race suite kept its locks for over 5 s) and only then
// writes Terminate and closes the socket, draining for up to 15 s. Until
// then the backend, idle in its transaction, keeps every lock it holds. So
// the socket is closed here at once as well: a backend that is not waiting
// for a lock reads EOF and exits in milliseconds. (One that is still waiting
// for a lock does not read its socket; the cancel request ends that wait,
// or the backend exits as soon as the lock is granted and it finds the
// socket closed.)
//
// Over TLS, closing the *tls.Conn first writes a close_notify alert under a
// write deadline of its own, 5 s, which no context shortens: with the
// socket's send buffer full (a frozen peer) that close alone outlasted the
// bound. So once timeout has passed the raw socket under it is closed,
// which fails any write still blocked. (A timer per close: this path runs
// only for connections being destroyed.)
func closeNow(raw *pgx.Conn, timeout time.Duration) {
	pg := raw.PgConn()
	nc := pg.Conn()
	sock := nc
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
		sock = t.NetConn()
	}
	if timeout <= 0 {
		timeout = DefaultCleanupTimeout
	}
	cut := time.AfterFunc(timeout, func() { _ = sock.Close() })
	defer cut.Stop()
	if !raw.IsClosed() {
		ctx, cancel := CleanupContext(context.Background(), timeout)
		_ = raw.Close(ctx) // the session ends either way: Close drops the socket on error
		cancel()
	}
	// Idempotent for a socket pgx closed itself; concurrent with pgx's
	// background close otherwise, which then fails its writes and stops.
	_ = nc.Close()
}

// Destroy marks the connection dirty with reason and releases it, which
// closes it. It is a shorthand for MarkDirty followed by Release.
func (c *Conn) Destroy(reason error) {
	c.MarkDirty(reason)
	c.Release()
}

// WithConn pins one connection of pool, lends it to fn ([Conn.Lend]), and
// releases it by the rule in the package doc: whatever fn did, the
// connection goes back to the pool as a fresh connection of the pool would
// be, identity, settings and session state included, with no session-level
// advisory lock (one round trip, see [Conn.Reset]), or it is destroyed;
// when fn sent nothing on it ([Conn.Reclaim]), it goes back as it came,
// with no round trip (a session the server ended while its last words were
// still on the way aside: see the package doc). ctx governs acquiring
// the connection and is passed to fn; the reset runs under the cleanup
// bound. fn's error is returned as is. With [ConnOptions.DeferIdentity],
// a failure of the identity read at the first Lend destroys the connection
// and is returned, and fn does not run. A panic in fn destroys the
// connection and is re-raised. fn must not call Release itself.
func WithConn(ctx context.Context, pool *pgxpool.Pool, opts *ConnOptions, fn func(ctx context.Context, c *Conn) error) error {
	c, err := Acquire(ctx, pool, opts)
	if err != nil {
		return err
	}
	defer c.Release()
	if err := c.lend(true); err != nil {
		// The first Lend's identity read failed (DeferIdentity): pooltx
		// closed the connection, and fn does not run on it.
		return err
	}
	err = runGuarded(c, fn, ctx, c)
	// Whatever fn did, the reset runs now, unless fn sent nothing on the
	// connection (Reclaim): a Reset or MarkClean that fn called itself,
	// with more work after it, must not vouch for the connection.
	c.clean = c.Reclaim()
	return err
}

// dropNotifications empties conn's queue of notifications that pgx received
// for LISTENs of the code it was lent to (the reset's UNLISTEN * ends the
// registrations, not what had already arrived), so the next borrower's
// WaitForNotification never returns another borrower's. An ended context
// makes WaitForNotification return the queued ones and then, without
// touching the connection, its error.
func dropNotifications(conn *pgx.Conn) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		if _, err := conn.WaitForNotification(done); err != nil {
			return
		}
	}
}

// WithConnValue is [WithConn] for a callback that returns a value.
func WithConnValue[T any](ctx context.Context, pool *pgxpool.Pool, opts *ConnOptions, fn func(ctx context.Context, c *Conn) (T, error)) (T, error) {
	var v T
	err := WithConn(ctx, pool, opts, func(ctx context.Context, c *Conn) error {
		var err error
		v, err = fn(ctx, c)
		return err
	})
	return v, err
}

// runGuarded runs fn(a, b); when fn panics it marks c dirty, releases
// (destroys) it, and re-raises the panic. fn takes its arguments from here,
// not from a closure, which would cost an allocation per call.
func runGuarded[A, B any](c *Conn, fn func(A, B) error, a A, b B) (err error) {
	panicked := true
	defer func() {
		if !panicked {
			return
		}
		r := recover()
		if r == nil {
			// runtime.Goexit (t.FailNow in a test callback): no panic to
			// re-raise, but the connection's state is unknown all the same.
			c.Destroy(errors.New("pooltx: callback exited its goroutine"))
			return
		}
		c.Destroy(fmt.Errorf("pooltx: callback panicked: %v", r))
		panic(r)
	}()
	err = fn(a, b)
	panicked = false
	return err
}
