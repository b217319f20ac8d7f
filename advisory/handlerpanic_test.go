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
