package advisory_test

import (
	"context"
	"strings"
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
	pgtest.SetOnConnect(cfg, "SET search_path = "+pgx.Identifier{schema}.Sanitize(), "SET work_mem = '9MB'")
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

// Review 23: a session-scope call whose proxy check failed without closing
// the connection (pgx refuses the simple protocol under
// standard_conforming_strings off; a plain borrower's DEALLOCATE ALL
// leaves pgx's cached check to fail with 26000) handed it back through the
// reset, which before the connection's first Lend had nothing recorded
// and dropped what AfterConnect had set. The check changes nothing: the
// connection goes back as it came.
func TestAFailedProxyCheckKeepsAfterConnectSettings(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	for _, how := range []string{"simple protocol, standard_conforming_strings off", "DEALLOCATE ALL by a plain borrower",
		"simple protocol, standard_conforming_strings off, AllowProxy: the lock statement refused"} {
		t.Run(how, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			connect := "SET search_path = " + pgx.Identifier{schema}.Sanitize()
			if how[0] == 's' {
				// pgx refuses the simple protocol's statements here; the
				// cleanup after the refused lock statement must not.
				cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
				connect += "; SET standard_conforming_strings = off"
			}
			pgtest.SetOnConnect(cfg, connect)
			pool := pgtest.NewPool(t, cfg)
			seen := func() (string, uint32) {
				t.Helper()
				var sp string
				var pid uint32
				require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('search_path'), pg_backend_pid()", pgx.QueryExecModeExec).Scan(&sp, &pid))
				return sp, pid
			}
			want, pid := seen()
			if how[0] == 'D' {
				// A first Locker's call caches the check; a plain borrower
				// then deallocates every prepared statement.
				h, err := newLocker(t, pool, advisory.Config{}).Lock(ctx, key(t), nil)
				require.NoError(t, err)
				require.NoError(t, h.Unlock(ctx))
				_, err = pool.Exec(ctx, "DEALLOCATE ALL")
				require.NoError(t, err)
			}
			_, err := newLocker(t, pool, advisory.Config{AllowProxy: strings.Contains(how, "AllowProxy")}).Lock(ctx, key(t), nil)
			require.Error(t, err, "the proxy check or the lock statement fails")
			got, p := seen()
			assert.Equal(t, pid, p, "the same backend")
			assert.Equal(t, want, got, "AfterConnect's search_path")
		})
	}
}
