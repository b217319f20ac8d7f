package pooltx_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// Release's doc and the package doc's panics: a panic out of Release's
// reset (the pool's OnNotice, called while the reset's answers are read)
// destroys the connection and gives its slot back to the pool before it
// goes on up; the session and its locks end (review 28b: the pool kept the
// slot, the next Acquire waited forever and pool.Close hung).
func TestAPanicInReleasesResetDestroysTheConnection(t *testing.T) {
	ctx := testCtx(t)
	var armed atomic.Bool
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug5" // a notice in every answer
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) {
		if armed.CompareAndSwap(true, false) {
			panic("notice handler")
		}
	}
	pool := pgtest.NewPool(t, cfg)
	const key = 28031
	var pid uint32
	require.PanicsWithValue(t, "notice handler", func() {
		_ = pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			conn := c.Lend(ctx)
			pid = conn.PgConn().PID()
			_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(key))
			require.NoError(t, err)
			armed.Store(true) // the next notice is the reset's
			return nil
		})
	})
	assert.Zero(t, pool.Stat().AcquiredConns(), "the slot came back")
	var next uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&next))
	assert.NotEqual(t, pid, next, "the connection was destroyed")
	awaitKeyFree(ctx, t, pgtest.Pool(t), key)
}

// The package doc's panics: a panic out of Acquire's first-pin identity
// read (the pool's OnNotice) destroys the connection and gives its slot
// back before it goes on up (review 29e: the slot stayed taken for good).
func TestAPanicInAcquiresIdentityReadDestroysTheConnection(t *testing.T) {
	ctx := testCtx(t)
	var armed atomic.Bool
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug5"
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) {
		if armed.CompareAndSwap(true, false) {
			panic("notice handler")
		}
	}
	pool := pgtest.NewPool(t, cfg)
	// Open the connection through pgxpool alone: pooltx has not pinned it.
	pc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	pid := pc.Conn().PgConn().PID()
	pc.Release()
	armed.Store(true) // the next notice is the identity read's
	require.PanicsWithValue(t, "notice handler", func() { _, _ = pooltx.Acquire(ctx, pool, nil) })
	assert.Zero(t, pool.Stat().AcquiredConns(), "the slot came back")
	c, err := pooltx.Acquire(ctx, pool, nil)
	require.NoError(t, err)
	assert.NotEqual(t, pid, c.Conn().PgConn().PID(), "the connection was destroyed")
	c.Release()
}

// The same, with ConnOptions.DeferIdentity: the identity read runs at the
// first Lend; a panic out of it marks the connection dirty, and Release
// destroys it.
func TestAPanicInLendsIdentityReadDestroysTheConnection(t *testing.T) {
	ctx := testCtx(t)
	var armed atomic.Bool
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug5"
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) {
		if armed.CompareAndSwap(true, false) {
			panic("notice handler")
		}
	}
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true})
	require.NoError(t, err)
	armed.Store(true)
	require.PanicsWithValue(t, "notice handler", func() { c.Lend(ctx) })
	require.Error(t, c.Dirty())
	assert.True(t, c.Release(), "destroyed")
	assert.Zero(t, pool.Stat().AcquiredConns())
}
