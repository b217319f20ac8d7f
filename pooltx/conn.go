package pooltx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
}

// Acquire pins one connection of pool. ctx governs only the wait for a
// connection. The caller must call [Conn.Release] exactly once (more calls
// are harmless).
func Acquire(ctx context.Context, pool *pgxpool.Pool, opts *ConnOptions) (*Conn, error) {
	if pool == nil {
		return nil, errors.New("pooltx: nil pool")
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pooltx: acquire connection: %w", err)
	}
	return &Conn{pc: pc, conn: pc.Conn(), timeout: opts.cleanupTimeout()}, nil
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

// Release ends the pin. A connection that is clean (not marked dirty, open,
// not busy, outside any transaction) goes back to the pool; any other is
// hijacked out of the pool and closed under a bounded cleanup context, so
// the server ends its session and every lock it held. Release is
// idempotent and reports whether the connection was destroyed.
func (c *Conn) Release() (destroyed bool) {
	if c.pc == nil {
		return false
	}
	pc := c.pc
	c.pc = nil
	pg := c.conn.PgConn()
	if c.dirty == nil && !c.conn.IsClosed() && !pg.IsBusy() && pg.TxStatus() == 'I' {
		pc.Release()
		return false
	}
	raw := pc.Hijack()
	ctx, cancel := CleanupContext(context.Background(), c.timeout)
	defer cancel()
	_ = raw.Close(ctx) // the session ends either way: Close drops the socket on error
	return true
}

// Destroy marks the connection dirty with reason and releases it, which
// closes it. It is a shorthand for MarkDirty followed by Release.
func (c *Conn) Destroy(reason error) {
	c.MarkDirty(reason)
	c.Release()
}

// WithConn pins one connection of pool, runs fn with it, and releases it by
// the rule in the package doc. ctx governs acquiring the connection and is
// passed to fn. fn's error is returned as is. A panic in fn destroys the
// connection and is re-raised. fn must not call Release itself.
func WithConn(ctx context.Context, pool *pgxpool.Pool, opts *ConnOptions, fn func(ctx context.Context, c *Conn) error) error {
	c, err := Acquire(ctx, pool, opts)
	if err != nil {
		return err
	}
	defer c.Release()
	return runGuarded(c, func() error { return fn(ctx, c) })
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

// runGuarded runs fn; when fn panics it marks c dirty, releases (destroys)
// it, and re-raises the panic.
func runGuarded(c *Conn, fn func() error) (err error) {
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
	err = fn()
	panicked = false
	return err
}
