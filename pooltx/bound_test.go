package pooltx_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/pooltx"
)

// TestBoundCleanupEndsAStatementThatOutlastsIt: a statement still running
// when the cleanup timeout has passed fails (it would sleep 5 s otherwise),
// pgx closes the connection, and Release destroys it.
func TestBoundCleanupEndsAStatementThatOutlastsIt(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{CleanupTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	c.BoundCleanup()
	_, err = c.Conn().Exec(context.Background(), "SELECT pg_sleep(5)")
	c.EndBound()
	require.Error(t, err)
	assert.True(t, c.Conn().IsClosed(), "pgx closed the connection")
	assert.True(t, c.Release(), "destroyed")
}

// TestEndBoundLeavesTheConnectionUnbounded: after EndBound, a statement
// longer than the cleanup timeout runs to its end, no socket deadline was
// set, and the connection goes back to the pool.
func TestEndBoundLeavesTheConnectionUnbounded(t *testing.T) {
	ctx := testCtx(t)
	rt := &roundtrip.Counter{}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DialFunc = rt.DialFunc
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, &pooltx.ConnOptions{CleanupTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	rt.Deadlines()
	c.BoundCleanup()
	_, err = c.Conn().Exec(context.Background(), "SELECT 1")
	c.EndBound()
	require.NoError(t, err)
	_, err = c.Conn().Exec(context.Background(), "SELECT pg_sleep(0.3)")
	require.NoError(t, err)
	assert.Zero(t, rt.Deadlines(), "socket deadlines set")
	assert.False(t, c.Release(), "back to the pool")
}

// TestResetSetsNoSocketDeadline: WithConn's reset (Release's bounded
// reset) sets no deadline on the socket (a runtime timer per call; see
// pooltx.Conn.BoundCleanup).
func TestResetSetsNoSocketDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rt := &roundtrip.Counter{}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DialFunc = rt.DialFunc
	pool := pgtest.NewPool(t, cfg)
	noop := func(context.Context, *pooltx.Conn) error { return nil }
	for range 3 {
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, noop))
	}
	rt.Deadlines()
	for range 10 {
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, noop))
	}
	assert.Zero(t, rt.Deadlines(), "WithConn: socket deadlines set in 10 calls")
}
