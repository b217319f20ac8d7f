package advisory

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/cutoff"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// DefaultMaxKeys is the cap on keys in one call when Config.MaxKeys is 0.
const DefaultMaxKeys = 64

// deadlineGrace is how long a wait whose context deadline has passed is
// given for the server-side lock_timeout (set from that deadline) to end it
// with 55P03, before the context is enforced on the client side, which
// closes the connection.
const deadlineGrace = 500 * time.Millisecond

// Config configures a Locker. The zero value is ready to use: no logging,
// waits bounded only by the caller's context, DefaultMaxKeys keys per call,
// pooltx.DefaultCleanupTimeout for cleanup.
type Config struct {
	// Logger receives structured events: acquisitions and releases at
	// Debug, destroyed connections and failed cleanups at Warn. Keys are
	// logged with keys.Key.String (numbers and namespace names, never a
	// hashed source string). Nil means no logging.
	Logger *slog.Logger

	// LockTimeout bounds the whole wait of each blocking call: local
	// queue, connection and every key of a multi-key call together. On the
	// server it becomes PostgreSQL's lock_timeout for that call's lock
	// statement only (for several keys, each key gets what the earlier ones
	// left), so a wait that reaches it ends with ErrLockTimeout and keeps
	// its connection. Zero means no bound other than the context's
	// deadline. Options.Timeout overrides it per call.
	LockTimeout time.Duration

	// CleanupTimeout bounds each cleanup step (unlock, rollback, closing a
	// destroyed connection), which runs on a context the caller cannot
	// cancel. Zero means pooltx.DefaultCleanupTimeout. A transaction-scope
	// call's COMMIT, and the reset sent in its round trip, are not cleanup:
	// the call's ctx governs them.
	CleanupTimeout time.Duration

	// MaxKeys caps the distinct keys of one call; a call over it fails
	// with ErrInvalid before any SQL. Every key is an entry in the
	// cluster-wide lock table (about 64 x max_connections entries by
	// default), and a full table impairs every session. Zero means
	// DefaultMaxKeys.
	MaxKeys int

	// HeartbeatInterval is how often the watcher of a held lock's
	// connection (one per holder connection, see DisableMultiplexing; one
	// per lock when it is set) pings the server to detect what a dead
	// socket does not show: a frozen server or a silent network partition.
	// On a holder connection the ping is sent when the connection has not
	// answered any statement for HeartbeatInterval. A terminated backend or
	// a closed socket is seen at once regardless. Zero means
	// DefaultHeartbeatInterval; negative disables the pings.
	HeartbeatInterval time.Duration

	// HeartbeatTimeout bounds each heartbeat ping, and, while heartbeats
	// are on, each statement on a holder connection; one that does not
	// answer in time marks every lock on the connection lost. Zero means
	// DefaultHeartbeatTimeout. A loss is detected at most HeartbeatInterval
	// + HeartbeatTimeout after the partition began.
	HeartbeatTimeout time.Duration

	// AllowProxy lets session-scope calls run through a connection proxy
	// such as PgBouncer. By default the first session-scope call checks
	// for one (see DetectProxy) and fails with ErrProxy, because in
	// transaction pooling mode session locks do not exclude anybody. Set it
	// only for a proxy in session pooling mode.
	AllowProxy bool

	// AllowStandby lets calls lock on a hot standby. By default a call
	// whose connection reached one (the server says so: in_hot_standby,
	// PostgreSQL 14 and later) fails with ErrStandby, because a standby's
	// advisory locks exclude only the standby's own sessions. Set it only
	// when every party locks on that one standby.
	AllowStandby bool

	// MaxConns caps the pooled connections the Locker pins at once:
	// holder connections (each shared by any number of held locks, see
	// the package doc), connections of WithLock calls and of dedicated
	// held locks, and connections that wait, together; calls over the cap
	// wait their turn (FIFO, bounded by their timeout and context), and a
	// held lock that can go on an existing holder connection does not
	// count again. Zero means no cap beyond the pool's own size. Independently of it, the goroutines of
	// one Locker that wait for the same key pin at most two connections
	// between them: the first two in line wait on the server, the others
	// queue in process (multi-key calls queue for their first key only,
	// shared multi-key calls not at all).
	MaxConns int

	// DisableMultiplexing gives every held lock (Lock, TryLock, LockAll,
	// TryLockAll, Hold and its forms) a pooled connection of its own, with
	// its own watcher, as before multiplexing: N held locks pin N
	// connections, and a connection's loss is one lock's loss. By default
	// (false) held locks share holder connections: a Try call, and a
	// blocking call whose keys are free, runs on a holder connection that
	// has none of its keys; only a wait that must queue on the server takes
	// a connection of its own, which becomes a holder connection once
	// granted; and the loss of a holder connection is the loss of every
	// lock on it (see the package doc, "Held locks share connections").
	// WithLock and WithLockAll always keep a dedicated connection.
	DisableMultiplexing bool

	// Tracer, when set, receives acquisition events; if it also implements
	// ReleaseTracer or LostTracer it receives those events too. See
	// MultiTracer for several. Its methods run on the caller's goroutine
	// (TraceLost on the watcher's, when the watcher finds a loss); a panic
	// in one is recovered and logged at level Error, and the call goes on.
	Tracer AcquireTracer
}

// DefaultTryConnWait bounds how long a Try call waits for a connection
// (under Config.MaxConns, in the pool, connecting) when Config.LockTimeout
// is zero. A Try call never waits for a lock.
const DefaultTryConnWait = time.Second

// tryConnWait is how long a Try call may wait for a connection.
func (l *Locker) tryConnWait() time.Duration {
	if l.cfg.LockTimeout > 0 {
		return l.cfg.LockTimeout
	}
	return DefaultTryConnWait
}

// Defaults for the loss watcher of held locks.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatTimeout  = 2 * time.Second
)

// Options are per-call options. A nil *Options means exclusive mode and the
// Config's timeout.
type Options struct {
	// Shared takes the keys in shared mode: any number of shared holders,
	// no exclusive one.
	Shared bool

	// Timeout bounds the wait of a blocking call, overriding
	// Config.LockTimeout. Zero means the Config's; negative means no bound
	// other than the context. It is ignored by Try calls, which wait only
	// for a connection, for at most Config.LockTimeout, else
	// DefaultTryConnWait.
	Timeout time.Duration

	// TxOptions are passed to BEGIN by the calls that begin a transaction
	// of their own (WithXactLock, TryWithXactLock, WithXactLockAll,
	// TryWithXactLockAll), as pgx.Conn.BeginTx takes them: isolation
	// level, access mode and deferrable mode, each empty or one of pgx's
	// named values (pgx.Serializable, pgx.ReadOnly, pgx.Deferrable, ...).
	// BEGIN still shares its round trip with the lock. Any other value, a
	// BeginQuery or a CommitQuery is refused with ErrInvalid before any SQL
	// is sent: pgx writes the values into BEGIN unquoted, the call's
	// BEGIN is what its lock relies on, and its COMMIT shares a round trip
	// with the session's reset. Other calls ignore TxOptions. Under
	// REPEATABLE READ or SERIALIZABLE the lock statement takes the
	// transaction's snapshot before it waits (see "Isolation" in the
	// package doc): IsoLevel pgx.ReadCommitted keeps the callback's reads
	// current whatever the session's default.
	TxOptions pgx.TxOptions
}

func (o *Options) shared() bool { return o != nil && o.Shared }

func (o *Options) txOptions() pgx.TxOptions {
	if o == nil {
		return pgx.TxOptions{}
	}
	return o.TxOptions
}

// checkTxOptions validates Options.TxOptions (see there).
func (o *Options) checkTxOptions() error {
	t := o.txOptions()
	switch {
	case t.BeginQuery != "" || t.CommitQuery != "":
		return invalid("Options.TxOptions: BeginQuery and CommitQuery are not supported (the call's own BEGIN and COMMIT hold the lock)")
	case !slices.Contains([]pgx.TxIsoLevel{"", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted}, t.IsoLevel):
		return invalid("Options.TxOptions: unknown IsoLevel %q", t.IsoLevel)
	case !slices.Contains([]pgx.TxAccessMode{"", pgx.ReadWrite, pgx.ReadOnly}, t.AccessMode):
		return invalid("Options.TxOptions: unknown AccessMode %q", t.AccessMode)
	case !slices.Contains([]pgx.TxDeferrableMode{"", pgx.Deferrable, pgx.NotDeferrable}, t.DeferrableMode):
		return invalid("Options.TxOptions: unknown DeferrableMode %q", t.DeferrableMode)
	}
	return nil
}

// Locker takes PostgreSQL advisory locks through a pgx pool. It is safe for
// concurrent use. Every session-scope callback call (WithLock) pins one
// pooled connection for as long as the lock is held; held locks (Lock,
// Hold) share holder connections unless Config.DisableMultiplexing is set.
type Locker struct {
	pool   *pgxpool.Pool
	cfg    Config
	log    *slog.Logger
	silent bool // no Tracer and a logger that discards: spans need no clock (see span)

	gates   gates   // per-key local wait queues
	conns   connCap // Config.MaxConns; nil: no cap
	holders holders // shared holder connections (see holderConn)

	proxyState atomic.Int32 // 0 unchecked, 1 direct, 2 proxied (checkProxy)
}

// New returns a Locker over pool. It returns ErrInvalid for a nil pool or a
// negative setting in cfg.
func New(pool *pgxpool.Pool, cfg Config) (*Locker, error) {
	if pool == nil {
		return nil, invalid("nil pool")
	}
	if cfg.LockTimeout < 0 || cfg.CleanupTimeout < 0 || cfg.MaxKeys < 0 || cfg.HeartbeatTimeout < 0 || cfg.MaxConns < 0 {
		return nil, invalid("negative Config setting")
	}
	if cfg.CleanupTimeout == 0 {
		cfg.CleanupTimeout = pooltx.DefaultCleanupTimeout
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	switch {
	case cfg.HeartbeatInterval == 0:
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	case cfg.HeartbeatInterval < 0:
		cfg.HeartbeatInterval = 0 // disabled
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Locker{pool: pool, cfg: cfg, log: log, silent: cfg.Tracer == nil && log.Handler() == slog.DiscardHandler}
	if cfg.MaxConns > 0 {
		l.conns = make(connCap, cfg.MaxConns)
	}
	return l, nil
}

// Pool returns the pool the Locker draws connections from.
func (l *Locker) Pool() *pgxpool.Pool { return l.pool }

// timeout returns the wait bound for one blocking call (0 = none).
func (l *Locker) timeout(opts *Options) time.Duration {
	if opts != nil && opts.Timeout != 0 {
		if opts.Timeout < 0 {
			return 0
		}
		return opts.Timeout
	}
	return l.cfg.LockTimeout
}

// waitBound returns the context that bounds a call's whole wait (local
// queue, connection cap, pool, server): ctx, shortened by the call's
// timeout, on w, a zero boundWait in the call's state (w.stop ends it). A
// Try call waits only for a connection, for at most tryConnWait.
func (l *Locker) waitBound(ctx context.Context, w *boundWait, opts *Options, try bool) context.Context {
	if try {
		return w.start(ctx, l.tryConnWait())
	}
	if d := l.timeout(opts); d > 0 {
		return w.start(ctx, d)
	}
	return ctx
}

// serverWait is the server-side part of one blocking wait: the context
// to run the lock statement under, the bound of the whole wait to enforce
// on the server (0 = leave the server's lock_timeout alone), and what was
// done to end the wait early. It lives inside the call's own state (one
// allocation per call): only a wait that is actually ended early allocates
// more (the watcher's timer and channel).
type serverWait struct {
	ctx   context.Context
	bound time.Duration // the server-side bound of the wait; 0: none

	det       detached // ctx, when the wait is watched
	wctx      context.Context
	pg        *pgconn.PgConn
	stopWatch func() bool    // from context.AfterFunc; nil when nothing is watched
	watcher   sync.WaitGroup // counts the watcher until it has returned or can no longer run
	stopped   bool           // stop has run (the caller's goroutine only)

	mu       sync.Mutex    // orders the watcher's backstop against stop
	over     bool          // under mu: the statement is over
	finished chan struct{} // under mu: made by a running watcher, closed by stop

	sent atomic.Bool // a cancel request went to the server
	hard atomic.Bool // the socket's deadline was cut to end the statement

	try    cutoff.Bound // a Try statement's bound (startTry)
	tryOn  bool         // try is started and not yet ended (stopTry)
	tryCut bool         // the bound passed before the statement was over
}

// startTry bounds a Try call's statement, which waits for no lock, by d
// (Locker.tryConnWait), on pg's socket: a server or network that does not
// answer it does not hold the call until ctx ends (forever, without a
// deadline). endTry ends the bound and gives the call's error for err.
func (w *serverWait) startTry(pg *pgconn.PgConn, d time.Duration) {
	w.try.Start(pg.Conn(), d)
	w.tryOn = true
}

// stopTry ends startTry's bound, once the statement is over; idempotent.
func (w *serverWait) stopTry() {
	if w.tryOn {
		w.tryOn = false
		w.tryCut = !w.try.End()
	}
}

// endTry ends startTry's bound and returns err, the statement's, as the
// call's: a statement that went unanswered until the bound, or until ctx's
// deadline, is ErrNoConnection (with context.DeadlineExceeded), not a lock
// timeout: a Try call never waits for a lock.
func (w *serverWait) endTry(ctx context.Context, err error) error {
	w.stopTry()
	if w.tryCut && err != nil {
		return noConnection(join(err, context.DeadlineExceeded))
	}
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)) {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return noConnection(err)
		}
	}
	return err
}

// detached is context.WithoutCancel without its allocation: it keeps the
// values of parent (tracers, loggers) but can neither end nor expire, so
// pgx does not watch it. It is embedded in per-call state.
type detached struct{ parent context.Context }

func (*detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detached) Done() <-chan struct{}       { return nil }
func (*detached) Err() error                  { return nil }
func (d *detached) Value(key any) any         { return d.parent.Value(key) }

// stop ends the arrangement; idempotent. After it returns, no cancel
// request is in flight from this wait and the socket is left alone.
func (w *serverWait) stop() {
	if w.stopWatch == nil || w.stopped {
		return
	}
	w.stopped = true
	w.mu.Lock()
	w.over = true
	if w.finished != nil {
		close(w.finished)
	}
	w.mu.Unlock()
	if w.stopWatch() {
		w.watcher.Done() // the watcher will never run
	}
	w.watcher.Wait() // it ran or is running: wait for it to end
}

// settle marks c dirty when the wait was ended in a way that leaves the
// connection in doubt: its socket deadline was cut, or a cancel request was
// sent but the statement did not end with 57014 because of it (the request
// may still be pending in the backend, which would cancel whatever
// statement runs next on the connection, possibly another caller's after it
// went back to the pool). It reports whether it did.
func (w *serverWait) settle(c *pooltx.Conn, err error) bool {
	if w.hard.Load() {
		c.MarkDirty(errors.New("advisory: lock wait cut short on the client"))
		return true
	}
	if !w.sent.Load() {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeQueryCanceled {
		return false // the cancel was consumed by the wait it was meant for
	}
	c.MarkDirty(errors.New("advisory: a cancel request may be pending on the connection"))
	return true
}

// cut returns err, the lock statement's, joined with
// context.DeadlineExceeded when the backstop cut the statement short
// because the call's bound had passed (a server or network that went
// silent): without it, a bound that was the call's own timeout
// (Options.Timeout, Config.LockTimeout) rather than ctx's deadline left
// only the socket's i/o timeout, which classify does not read as the
// bound, and the call's error matched no sentinel.
func (w *serverWait) cut(err error) error {
	if err != nil && w.hard.Load() && w.wctx != nil && errors.Is(w.wctx.Err(), context.DeadlineExceeded) {
		return join(err, context.DeadlineExceeded)
	}
	return err
}

// waitFor prepares the server-side part of a blocking wait bounded by wctx,
// on the connection pg.
//
// The statement runs under a context that cannot end (pgx then does not
// watch it, and its context handling, which by default closes the socket,
// never fires). Instead:
//
//   - wctx's deadline becomes a server-side lock_timeout, so that a wait
//     that times out ends with 55P03 and keeps its connection; for several
//     keys, each key's wait gets what the earlier keys left of it (see
//     keySet.queue), so the bound is the whole call's;
//   - an explicit cancellation of wctx sends PostgreSQL a cancel request,
//     which ends the wait server-side with 57014 at once. Merely closing
//     the socket would leave the backend queued in pg_locks (it does not
//     read its socket while it waits) until the lock is granted to it.
//     PostgreSQL ignores a cancel request that reaches a backend still
//     reading the statement (or idle), so a cancellation in the short
//     window between sending the statement and the backend starting it is
//     lost, and only the backstop below ends the wait (callers check wctx
//     just before sending, which keeps that window to the network's
//     latency);
//   - if neither answers within deadlineGrace, the socket's deadline is
//     cut: the statement fails, pgx closes the connection, and it is
//     destroyed.
//
// (The session and transaction helpers use arrange on a serverWait in
// their call state; waitFor serves the batch form.)
func (l *Locker) waitFor(wctx context.Context, pg *pgconn.PgConn) *serverWait {
	w := &serverWait{}
	w.arrange(wctx, pg)
	return w
}

// arrange is waitFor in place, on a zero serverWait that must not move
// afterwards.
func (w *serverWait) arrange(wctx context.Context, pg *pgconn.PgConn) {
	deadline, hasDeadline := wctx.Deadline()
	if !hasDeadline && wctx.Done() == nil {
		w.ctx = wctx // cannot end: nothing to arrange
		return
	}
	w.det.parent = wctx
	w.ctx, w.wctx, w.pg = &w.det, wctx, pg
	if hasDeadline {
		w.bound = max(time.Until(deadline), time.Millisecond)
	}
	w.watcher.Add(1)
	if bw, ok := wctx.(*boundWait); ok {
		w.stopWatch = bw.AfterFunc(w.watch) // one hop: context.AfterFunc(wctx) would add one
	} else {
		w.stopWatch = context.AfterFunc(wctx, w.watch)
	}
}

// watch runs when wctx ends while the statement is on.
func (w *serverWait) watch() {
	defer w.watcher.Done()
	t := time.NewTimer(deadlineGrace)
	defer t.Stop()
	if !errors.Is(w.wctx.Err(), context.DeadlineExceeded) {
		w.sent.Store(true)
		cctx, cancel := context.WithTimeout(context.Background(), deadlineGrace)
		_ = w.pg.CancelRequest(cctx) // best effort: the timer below is the backstop
		cancel()
	}
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		return
	}
	w.finished = make(chan struct{})
	finished := w.finished
	w.mu.Unlock()
	select {
	case <-t.C:
	case <-finished:
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.over {
		w.hard.Store(true)
		_ = w.pg.Conn().SetDeadline(time.Now())
	}
}

// pin waits for the call's turn and a pooled connection: in the local
// queue of the call's first key (blocking calls that queue, see gate.go),
// then under the MaxConns cap, then in the pool, all bounded by wctx. The
// ticket must be left (t.leave()) once the lock statement is done, to let
// the next local waiter go to the server; unpin releases the connection.
// (The session and transaction helpers use pinInto with a ticket in their
// call state; pin serves the batch form.)
func (l *Locker) pin(wctx context.Context, r *request) (c *pooltx.Conn, t *ticket, err error) {
	return l.pinInto(wctx, r, &ticket{})
}

// pinInto is pin with the call's own zero ticket tk, which it returns (nil
// when the call does not queue).
func (l *Locker) pinInto(wctx context.Context, r *request, tk *ticket) (c *pooltx.Conn, t *ticket, err error) {
	if r.queues() {
		if err = l.gates.enterInto(wctx, r.s.all[0], tk); err != nil {
			return nil, nil, err
		}
		t = tk
	}
	if c, err = l.conn(wctx); err != nil {
		t.leave()
		return nil, nil, err
	}
	return c, t, nil
}

// conn takes a pooled connection under the MaxConns cap, bounded by wctx.
// Its errors match ErrNoConnection, or ErrStandby for a connection to a hot
// standby (refuseStandby).
func (l *Locker) conn(wctx context.Context) (*pooltx.Conn, error) {
	if err := l.conns.acquire(wctx); err != nil {
		return nil, noConnection(err)
	}
	var c *pooltx.Conn
	done := false
	defer func() {
		if !done {
			// A panic of the pool's (a PrepareConn or tracer hook's):
			// the slot of Config.MaxConns, and a connection already
			// pinned, go back; the panic goes on up.
			if c != nil {
				c.MarkDirty(errStatementPanicked)
				l.unpin(c)
			} else {
				l.conns.release()
			}
		}
	}()
	c, err := pooltx.Acquire(wctx, l.pool, l.connOptions())
	if err != nil {
		done = true
		l.conns.release()
		return nil, noConnection(err)
	}
	if err := l.refuseStandby(wctx, c); err != nil {
		done = true
		l.unpin(c)
		return nil, err
	}
	done = true
	return c, nil
}

// repin gives up c, found dead before anything was locked, and takes a
// live connection in its place, keeping the call's place in the key queue.
// pgxpool pings only connections idle for over a second, so after a
// restart or a terminate the next ones it hands out may be dead too: each
// candidate is pinged (bounded by wctx and Config.CleanupTimeout), and a
// dead one destroyed and replaced, at most the pool's size + 1 times. Its
// errors match ErrNoConnection.
func (l *Locker) repin(wctx context.Context, c *pooltx.Conn) (*pooltx.Conn, error) {
	l.unpin(c)
	return l.livePin(wctx)
}

// livePin is repin's search for a live connection.
func (l *Locker) livePin(wctx context.Context) (c *pooltx.Conn, err error) {
	for range l.pool.Stat().MaxConns() + 1 {
		if c, err = l.conn(wctx); err != nil {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(wctx, c.CleanupTimeout())
		err = c.Conn().Ping(pctx)
		cancel()
		if err == nil {
			return c, nil
		}
		c.MarkDirty(err)
		l.unpin(c)
		if wctx.Err() != nil {
			break
		}
	}
	return nil, noConnection(err)
}

// unpin releases (or destroys, when dirty) a connection taken by pin.
func (l *Locker) unpin(c *pooltx.Conn) {
	if c == nil {
		return
	}
	c.Release()
	l.conns.release()
}

func keyStrings(ks []keys.Key) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.String()
	}
	return out
}

// boolResults returns a row handler for statements that return one bool
// per key, counting the false answers into *falses.
func boolResults(falses *int) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var ok bool
			if err := rows.Scan(&ok); err != nil {
				return err
			}
			if !ok {
				*falses++
			}
		}
		return rows.Err()
	}
}
