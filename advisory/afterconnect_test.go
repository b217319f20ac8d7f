package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// README: after the reset the next borrower sees every setting as the
// library first found it, a SET run in AfterConnect included. Review 22:
// before, RESET ALL dropped those: after one WithLock whose callback sent
// anything, or one lock timeout on a connection's first use (whose cleanup
// ran the reset with nothing recorded yet), the pool's search_path and
// work_mem were the server's defaults.
func TestAfterConnectSettingsSurviveTheLibrary(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET search_path = "+pgx.Identifier{schema}.Sanitize()+"; SET work_mem = '9MB'", pgx.QueryExecModeSimpleProtocol)
		return err
	}
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	seen := func() [2]string {
		t.Helper()
		var v [2]string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('search_path'), current_setting('work_mem')").Scan(&v[0], &v[1]))
		return v
	}
	want := seen()
	require.Equal(t, "9MB", want[1])

	// A lock timeout on the connection's first use by the library.
	k := key(t)
	h := hold(ctx, t, false, k)
	err := l.WithLock(ctx, k, &advisory.Options{Timeout: 20 * time.Millisecond}, func(context.Context, *pgx.Conn) error { return nil })
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	assert.Equal(t, want, seen(), "after a lock timeout before the first lend")
	h.release()

	changes := func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "RESET ALL; SET work_mem = '64MB'", pgx.QueryExecModeSimpleProtocol)
		return err
	}
	require.NoError(t, l.WithLock(ctx, k, nil, changes))
	assert.Equal(t, want, seen(), "after WithLock")
	require.NoError(t, l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error { return changes(ctx, tx.Conn()) }))
	assert.Equal(t, want, seen(), "after WithXactLock")
	b := &pgx.Batch{}
	b.Queue("SET work_mem = '65MB'")
	require.NoError(t, l.WithXactLockBatch(ctx, []keys.Key{k}, nil, b))
	assert.Equal(t, want, seen(), "after WithXactLockBatch")
}
