package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

var errNotificationHandler = errors.New("notification handler")

// A held lock's watcher runs on the library's goroutine: a panic of the
// pool's OnNotification handler there (a NOTIFY to a channel the pool's
// AfterConnect LISTENs to) loses the lock, as a dead connection does, and
// does not end the process (review 28b: it did, for both forms).
func TestAPanicOfTheNotificationHandlerInTheWatcherLosesTheLock(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) {
			ctx := testCtx(t)
			channel := fmt.Sprintf("pgxlock_watch_%d", pgtest.UniqueInt64(t)&0xffffff)
			cfg := pgtest.Config(t)
			cfg.MaxConns = 2
			cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, "LISTEN "+channel)
				return err
			}
			cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { panic(errNotificationHandler) }
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: dedicated})
			k := key(t)
			h, err := l.Lock(ctx, k, nil)
			require.NoError(t, err)
			_, err = pgtest.Pool(t).Exec(ctx, "SELECT pg_notify($1, 'x')", channel)
			require.NoError(t, err)
			select {
			case <-h.Done():
			case <-ctx.Done():
				t.Fatal("the lock was not lost")
			}
			require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
			assert.ErrorIs(t, h.Err(), errNotificationHandler, "an error panicked with is in the chain")
			require.Eventually(t, func() bool { return newProbe(t).free(ctx, k, false) }, 10*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 10*time.Second, 5*time.Millisecond,
				"the slot came back")
		})
	}
}

// cancellingTracer is a pool QueryTracer that, once armed, gives the next
// statement containing match an already-cancelled context: pgx then
// refuses it before sending anything.
type cancellingTracer struct {
	match string
	armed atomic.Bool
}

func (c *cancellingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, c.match) && c.armed.CompareAndSwap(true, false) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		return cctx
	}
	return ctx
}

func (*cancellingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The package doc's Errors: an unlock that code of the pool's refused on a
// connection still open, after a callback that ran under the lock, is a
// *LockError wrapping a pooltx.CleanupError that matches no sentinel (the
// caller's context did not end), and the connection was destroyed, which
// released the lock.
func TestAnUnlockThePoolsCodeRefusedIsACleanupError(t *testing.T) {
	ctx := testCtx(t)
	tr := &cancellingTracer{match: "pg_advisory_unlock"}
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tr
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	var pid uint32
	err := l.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error {
		pid = c.PgConn().PID()
		tr.armed.Store(true)
		return nil
	})
	var le *advisory.LockError
	require.ErrorAs(t, err, &le)
	var ce *pooltx.CleanupError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "unlock", ce.Step)
	for _, s := range []error{advisory.ErrNotAcquired, advisory.ErrLockTimeout, advisory.ErrNoConnection,
		advisory.ErrDeadlock, advisory.ErrTooManyLocks, advisory.ErrNotHeld, advisory.ErrLockLost,
		advisory.ErrCallbackInTx, advisory.ErrTxAborted, advisory.ErrInvalid} {
		assert.NotErrorIs(t, err, s)
	}
	require.Eventually(t, func() bool { return newProbe(t).free(ctx, k, false) }, 10*time.Second, 5*time.Millisecond)
	var next uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&next))
	assert.NotEqual(t, pid, next, "the connection was destroyed")
}

// blockingHandler blocks the handler it is given to, once armed, until
// released, and tells when it has begun to.
type blockingHandler struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newBlockingHandler() *blockingHandler {
	return &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingHandler) handle() {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
}

// notBefore fails t if done is closed within d (a bounded check that
// something has not happened yet, not a synchronisation).
func notBefore(t *testing.T, done <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-done:
		t.Fatalf("%s while the handler blocked", what)
	case <-time.After(d):
	}
}

// The package doc: a handler that blocks holds the read it runs in. A
// held lock's watcher then sees no loss until it returns (a terminated
// backend included), and the loss is reported once it has.
func TestABlockingNotificationHandlerHoldsTheWatcher(t *testing.T) {
	ctx := testCtx(t)
	bh := newBlockingHandler()
	channel := fmt.Sprintf("pgxlock_block_%d", pgtest.UniqueInt64(t)&0xffffff)
	cfg := pgtest.Config(t)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "LISTEN "+channel)
		return err
	}
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { bh.handle() }
	pool := pgtest.NewPool(t, cfg)
	const beat = 50 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{HeartbeatInterval: beat, HeartbeatTimeout: beat})
	admin := pgtest.Pool(t)
	k := key(t)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	pid := holderPID(ctx, t, admin, k)
	bh.armed.Store(true)
	_, err = admin.Exec(ctx, "SELECT pg_notify($1, 'x')", channel)
	require.NoError(t, err)
	<-bh.entered // the watcher runs the handler
	_, err = admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid))
	require.NoError(t, err)
	notBefore(t, h.Done(), 10*(beat+beat), "the loss was seen")
	close(bh.release)
	<-h.Done()
	require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
}

// The package doc: an Unlock whose statement meets a blocking OnNotice
// returns only once the handler does, past its bound (CleanupTimeout).
func TestABlockingNoticeHandlerHoldsTheUnlock(t *testing.T) {
	ctx := testCtx(t)
	bh := newBlockingHandler()
	pool := pgtest.NewPool(t, pgtest.NoisyConfig(t, bh.handle)) // a notice in every answer
	const bound = 50 * time.Millisecond
	l := newLocker(t, pool, advisory.Config{CleanupTimeout: bound, DisableMultiplexing: true, HeartbeatInterval: -1})
	k := key(t)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	bh.armed.Store(true)
	done := make(chan struct{})
	go func() { _ = h.Unlock(ctx); close(done) }()
	<-bh.entered
	notBefore(t, done, 10*bound, "Unlock returned")
	close(bh.release)
	<-done
	require.Eventually(t, func() bool { return newProbe(t).free(ctx, k, false) }, 10*time.Second, 5*time.Millisecond)
}
