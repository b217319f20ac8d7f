package advisory

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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

	// LockTimeout bounds each blocking wait (it becomes PostgreSQL's
	// lock_timeout for that wait only). Zero means no bound other than the
	// context's deadline. Options.Timeout overrides it per call.
	LockTimeout time.Duration

	// CleanupTimeout bounds each cleanup step (unlock, rollback, closing a
	// destroyed connection), which runs on a context the caller cannot
	// cancel. Zero means pooltx.DefaultCleanupTimeout.
	CleanupTimeout time.Duration

	// MaxKeys caps the distinct keys of one call; a call over it fails
	// with ErrInvalid before any SQL. Every key is an entry in the
	// cluster-wide lock table (about 64 x max_connections entries by
	// default), and a full table impairs every session. Zero means
	// DefaultMaxKeys.
	MaxKeys int

	// HeartbeatInterval is how often the watcher of a held Lock (and of
	// Hold's callback) pings the server to detect what a dead socket does
	// not show: a frozen server or a silent network partition. A
	// terminated backend or a closed socket is seen at once regardless.
	// Zero means DefaultHeartbeatInterval; negative disables the pings.
	HeartbeatInterval time.Duration

	// HeartbeatTimeout bounds each heartbeat ping; a ping that does not
	// answer in time marks the lock lost. Zero means
	// DefaultHeartbeatTimeout. A loss is detected at most HeartbeatInterval
	// + HeartbeatTimeout after the partition began.
	HeartbeatTimeout time.Duration

	// AllowProxy lets session-scope calls run through a connection proxy
	// such as PgBouncer. By default the first session-scope call checks
	// for one (see DetectProxy) and fails with ErrProxy, because in
	// transaction pooling mode session locks do not exclude anybody. Set it
	// only for a proxy in session pooling mode.
	AllowProxy bool

	// MaxConns caps the pooled connections the Locker pins at once, for
	// holders and waiters together; calls over the cap wait their turn
	// (FIFO, bounded by their timeout and context). Zero means no cap
	// beyond the pool's own size. Independently of it, the goroutines of
	// one Locker that wait for the same key pin one connection between
	// them: the others queue in process.
	MaxConns int

	// Tracer, when set, receives acquisition events; if it also implements
	// ReleaseTracer or LostTracer it receives those events too. See
	// MultiTracer for several.
	Tracer AcquireTracer
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
	// other than the context. It is ignored by Try calls.
	Timeout time.Duration
}

func (o *Options) shared() bool { return o != nil && o.Shared }

// Locker takes PostgreSQL advisory locks through a pgx pool. It is safe for
// concurrent use. Every session-scope call pins one pooled connection for
// as long as the lock is held.
type Locker struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	gates gates   // per-key local wait queues
	conns connCap // Config.MaxConns; nil: no cap

	proxyMu      sync.Mutex
	proxyChecked bool // a proxy check has succeeded
	proxied      bool // and found a proxy
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
	l := &Locker{pool: pool, cfg: cfg, log: log}
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

// waitBound returns the context that bounds a blocking call's whole wait
// (local queue, connection cap, pool, server): ctx, shortened by the
// call's timeout. Try calls do not wait and get ctx itself.
func (l *Locker) waitBound(ctx context.Context, opts *Options, try bool) (context.Context, context.CancelFunc) {
	if try {
		return ctx, func() {}
	}
	if d := l.timeout(opts); d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// serverWait is the server-side part of one blocking wait: the context
// to run the lock statement under, the lock_timeout to send ("" = leave the
// server's setting alone), and whether a cancel request was sent.
type serverWait struct {
	ctx     context.Context
	timeout string
	stopFn  func()
	sent    atomic.Bool // a cancel request went to the server
}

// noWait is the serverWait of a Try call: nothing to arrange.
func noWait(ctx context.Context) *serverWait { return &serverWait{ctx: ctx, stopFn: func() {}} }

// stop ends the arrangement; idempotent. After it returns, no cancel
// request is in flight from this wait.
func (w *serverWait) stop() { w.stopFn() }

// settle marks c dirty when a cancel request was sent but the statement
// did not end with 57014 because of it: the request may still be pending in
// the backend, which would cancel whatever statement runs next on the
// connection, possibly another caller's after it went back to the pool.
// It reports whether it did.
func (w *serverWait) settle(c *pooltx.Conn, err error) bool {
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

// waitFor prepares the server-side part of a blocking wait bounded by wctx,
// on the connection pg.
//
// The statement's context is detached from wctx, so that pgx's context
// handling (which, by default, closes the socket) does not see wctx end
// first. Instead:
//
//   - wctx's deadline becomes a server-side lock_timeout, so that a wait
//     that times out ends with 55P03 and keeps its connection;
//   - an explicit cancellation of wctx sends PostgreSQL a cancel request,
//     which ends the wait server-side with 57014 at once. Merely closing
//     the socket would leave the backend queued in pg_locks (it does not
//     read its socket while it waits) until the lock is granted to it;
//   - if neither answers within deadlineGrace, the statement's context is
//     cancelled after all and pgx closes the connection.
func (l *Locker) waitFor(wctx context.Context, pg *pgconn.PgConn) *serverWait {
	deadline, hasDeadline := wctx.Deadline()
	if !hasDeadline && wctx.Done() == nil {
		return noWait(wctx) // cannot end: nothing to arrange
	}
	w := &serverWait{}
	if hasDeadline {
		w.timeout = formatTimeout(time.Until(deadline))
	}
	qctx, cancel := context.WithCancelCause(context.WithoutCancel(wctx))
	w.ctx = qctx
	watched := make(chan struct{})
	stopWatch := context.AfterFunc(wctx, func() {
		defer close(watched)
		t := time.NewTimer(deadlineGrace)
		defer t.Stop()
		if !errors.Is(wctx.Err(), context.DeadlineExceeded) {
			w.sent.Store(true)
			cctx, ccancel := context.WithTimeout(context.Background(), deadlineGrace)
			_ = pg.CancelRequest(cctx) // best effort: the timer below is the backstop
			ccancel()
		}
		select {
		case <-t.C:
			cancel(context.Cause(wctx))
		case <-qctx.Done():
		}
	})
	var once sync.Once
	w.stopFn = func() {
		once.Do(func() {
			cancel(context.Canceled)
			if !stopWatch() {
				<-watched // the watcher ran or is running: wait for it to end
			}
		})
	}
	return w
}

// pin waits for the call's turn and a pooled connection: in the key queues
// (blocking calls only), then under the MaxConns cap, then in the pool,
// all bounded by wctx. leave must be called once the lock statement is
// done, to let the next local waiter go to the server; unpin releases the
// connection.
func (l *Locker) pin(wctx context.Context, s *keySet, try bool) (c *pooltx.Conn, leave func(), err error) {
	leave = func() {}
	if !try {
		if leave, err = l.gates.enter(wctx, s.all); err != nil {
			return nil, nil, err
		}
	}
	if err := l.conns.acquire(wctx); err != nil {
		leave()
		return nil, nil, err
	}
	c, err = pooltx.Acquire(wctx, l.pool, l.connOptions())
	if err != nil {
		l.conns.release()
		leave()
		return nil, nil, err
	}
	return c, leave, nil
}

// unpin releases (or destroys, when dirty) a connection taken by pin.
func (l *Locker) unpin(c *pooltx.Conn) {
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
