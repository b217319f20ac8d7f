package pooltx_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
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
	trap := pgtest.NewTrap("notice handler")
	cfg := pgtest.NoisyConfig(t, trap.Spring) // a notice in every answer
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	const key = 28031
	var pid uint32
	require.PanicsWithValue(t, "notice handler", func() {
		_ = pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			conn := c.Lend(ctx)
			pid = conn.PgConn().PID()
			_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(key))
			require.NoError(t, err)
			trap.Arm() // the next notice is the reset's
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
	trap := pgtest.NewTrap("notice handler")
	cfg := pgtest.NoisyConfig(t, trap.Spring) // a notice in every answer
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	// Open the connection through pgxpool alone: pooltx has not pinned it.
	pc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	pid := pc.Conn().PgConn().PID()
	pc.Release()
	trap.Arm() // the next notice is the identity read's
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
	trap := pgtest.NewTrap("notice handler")
	cfg := pgtest.NoisyConfig(t, trap.Spring) // a notice in every answer
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true})
	require.NoError(t, err)
	trap.Arm()
	require.PanicsWithValue(t, "notice handler", func() { c.Lend(ctx) })
	require.Error(t, c.Dirty())
	assert.True(t, c.Release(), "destroyed")
	assert.Zero(t, pool.Stat().AcquiredConns())
}

// endPanicTracer is a pool QueryTracer whose TraceQueryEnd panics, once
// armed, for the next statement beginning with prefix: pgx calls it after
// the statement's answers were all read.
type endPanicTracer struct {
	prefix string
	armed  atomic.Bool
}

type endPanicKey struct{}

func (e *endPanicTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, e.prefix) && e.armed.CompareAndSwap(true, false) {
		return context.WithValue(ctx, endPanicKey{}, true)
	}
	return ctx
}

func (*endPanicTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(endPanicKey{}) != nil {
		panic("tracer")
	}
}

// The package doc's panics: a panic of the pool's tracer in WithTx's
// ROLLBACK (with its reset), even once its answers were read, destroys the
// connection (review 30f: the reset ran again and the connection went back
// to the pool).
func TestAPanicInTheRollbackDestroysTheConnection(t *testing.T) {
	ctx := testCtx(t)
	tr := &endPanicTracer{prefix: "ROLLBACK"}
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tr
	pool := pgtest.NewPool(t, cfg)
	var pid uint32
	require.PanicsWithValue(t, "tracer", func() {
		_ = pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			pid = tx.Conn().PgConn().PID()
			_, err := tx.Exec(ctx, "SET application_name = 'dirty'") // lent work: the reset follows the ROLLBACK
			require.NoError(t, err)
			tr.armed.Store(true)
			return errors.New("roll back")
		})
	})
	assert.Zero(t, pool.Stat().AcquiredConns())
	var next uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&next))
	assert.NotEqual(t, pid, next, "the connection was destroyed")
}
