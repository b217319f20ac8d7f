package advisory

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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
	if cfg.LockTimeout < 0 || cfg.CleanupTimeout < 0 || cfg.MaxKeys < 0 || cfg.HeartbeatTimeout < 0 {
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
	return &Locker{pool: pool, cfg: cfg, log: log}, nil
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

// waitContext prepares a blocking wait. It returns the context to run the
// lock statement under and the lock_timeout to send ("" = leave the
// server's setting alone).
//
// A context deadline becomes a server-side lock_timeout, so that a wait
// that times out ends with 55P03 and keeps its connection. For that, the
// returned context ignores the deadline for deadlineGrace after it passes
// (pgx would otherwise close the connection at the deadline), while an
// explicit cancellation of ctx still interrupts the wait at once.
func (l *Locker) waitContext(ctx context.Context, timeout time.Duration) (context.Context, string, func()) {
	deadline, ok := ctx.Deadline()
	if !ok {
		if timeout <= 0 {
			return ctx, "", func() {}
		}
		return ctx, formatTimeout(timeout), func() {}
	}
	if rem := time.Until(deadline); timeout <= 0 || rem < timeout {
		timeout = rem
	}
	qctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	watched := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(watched)
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(ctx.Err())
			return
		}
		t := time.NewTimer(deadlineGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(context.DeadlineExceeded)
		case <-qctx.Done():
		}
	})
	var once sync.Once
	return qctx, formatTimeout(timeout), func() {
		once.Do(func() {
			cancel(context.Canceled)
			if !stopWatch() {
				<-watched // the watcher ran or is running: wait for it to end
			}
		})
	}
}

// log helpers: keep attribute building off the hot path when disabled.
func (l *Locker) debug(ctx context.Context, msg string, op string, ks []keys.Key, args ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, msg, append([]any{"op", op, "keys", keyStrings(ks)}, args...)...)
	}
}

func (l *Locker) warn(ctx context.Context, msg string, op string, ks []keys.Key, args ...any) {
	l.log.WarnContext(ctx, msg, append([]any{"op", op, "keys", keyStrings(ks)}, args...)...)
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

// drain returns a row handler for void-returning statements.
func drain(rows pgx.Rows) error {
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}
