package advisory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

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
			cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { panic("notification handler") }
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
			assert.ErrorContains(t, h.Err(), "notification handler")
			require.Eventually(t, func() bool { return newProbe(t).free(ctx, k, false) }, 10*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 10*time.Second, 5*time.Millisecond,
				"the slot came back")
		})
	}
}
