package pooltx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// appName is the application_name and backend of the pool's one connection,
// read by a borrower that is not pooltx.
func appName(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (string, uint32) {
	t.Helper()
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	var name string
	require.NoError(t, c.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name))
	return name, c.Conn().PgConn().PID()
}

// leave sets application_name on the pool's one connection through pgxpool
// alone, which puts the connection back as it is: the state a connection
// can have when pooltx is given it.
func leave(ctx context.Context, t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	_, err := pool.Exec(ctx, "SET application_name = '"+name+"'", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
}

// Work that sent nothing on its connection leaves the session as the pool
// gave it out, and the connection goes back without the reset (Reclaim):
// state another borrower left is still there, the backend is the same. Work
// that sent anything is followed by the reset.
func TestQuietWorkGoesBackAsItCame(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, pid := appName(ctx, t, pool)
	require.NotEqual(t, "left-by-another", fresh)

	leave(ctx, t, pool, "left-by-another")
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))
	name, p := appName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "WithConn, nothing sent: no reset")
	assert.Equal(t, pid, p)

	require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(context.Context, pgx.Tx) error { return nil }))
	name, p = appName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "WithTx, nothing sent: COMMIT alone")
	assert.Equal(t, pid, p)

	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		_, err := c.Conn().Exec(ctx, "SELECT 1")
		return err
	}))
	name, p = appName(ctx, t, pool)
	assert.Equal(t, fresh, name, "WithConn, a statement sent: reset")
	assert.Equal(t, pid, p)

	leave(ctx, t, pool, "left-by-another")
	require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}))
	name, _ = appName(ctx, t, pool)
	assert.Equal(t, fresh, name, "WithTx, a statement sent: reset with COMMIT")
}

// What the work handed pgx's frontend without flushing it counts as sent:
// Reclaim flushes it first, so the reset runs (here it finds the work's
// answer ahead of its own and the connection is destroyed), and the
// work's SET never reaches the next borrower.
func TestUnflushedWorkIsNotQuiet(t *testing.T) {
	ctx := testCtx(t)
	for _, flush := range []bool{false, true} {
		cfg := pgtest.Config(t)
		cfg.MaxConns = 1
		pool := pgtest.NewPool(t, cfg)
		fresh, _ := appName(ctx, t, pool)
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(_ context.Context, c *pooltx.Conn) error {
			fe := c.Conn().PgConn().Frontend()
			fe.Send(&pgproto3.Query{String: "SET application_name = 'sneaky'"})
			if flush {
				return fe.Flush() // answers left unread
			}
			return nil
		}))
		name, _ := appName(ctx, t, pool)
		assert.Equal(t, fresh, name, "flushed by the work: %v", flush)
	}
}

// A preamble is the caller's code, not pooltx's: unless the caller vouches
// for it (PreambleChangesNoState), WithTx resets after it even when fn sent
// nothing.
func TestPreambleIsResetUnlessVouchedFor(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, _ := appName(ctx, t, pool)
	opts := &pooltx.TxOptions{Preamble: func(b *pgx.Batch) {
		b.Queue("SELECT set_config('application_name', 'from-preamble', false)")
	}}
	require.NoError(t, pooltx.WithTx(ctx, pool, opts, func(context.Context, pgx.Tx) error { return nil }))
	name, _ := appName(ctx, t, pool)
	assert.Equal(t, fresh, name, "the preamble's session-level set_config is reset")

	leave(ctx, t, pool, "left-by-another")
	opts = &pooltx.TxOptions{PreambleChangesNoState: true, Preamble: func(b *pgx.Batch) {
		b.Queue("SELECT pg_advisory_xact_lock(7)")
	}}
	require.NoError(t, pooltx.WithTx(ctx, pool, opts, func(context.Context, pgx.Tx) error { return nil }))
	name, _ = appName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "a vouched-for preamble and a quiet fn: COMMIT alone")
}
