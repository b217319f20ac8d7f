package lease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

func TestFenceUpdate(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, note text, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, p1, "INSERT INTO "+accounts+" (id) VALUES (1)")
	f, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: "accounts"})
	require.NoError(t, err)

	require.NoError(t, f.Update(ctx, p1, 1, 3, map[string]any{"balance": 10, "note": "first"}))
	require.NoError(t, f.Update(ctx, p2, 1, 3, map[string]any{"balance": 20}), "the same holder writes again")
	require.NoError(t, f.Update(ctx, p2, 1, 5, map[string]any{"balance": 30}), "a later holder")
	err = f.Update(ctx, p1, 1, 3, map[string]any{"balance": 666})
	require.ErrorIs(t, err, lease.ErrLeaseLost, "a stale token")
	assert.Equal(t, `lease: fenced update "1": lost`, err.Error())
	assert.Equal(t, 30, queryOne[int](t, p1, "SELECT balance FROM "+accounts))
	assert.Equal(t, int64(5), queryOne[int64](t, p1, "SELECT fence_token FROM "+accounts))

	require.ErrorIs(t, f.Update(ctx, p1, 2, 9, map[string]any{"balance": 1}), lease.ErrNotFound)
	require.ErrorIs(t, f.Update(ctx, p1, 1, 9, nil), lease.ErrInvalid)
	require.ErrorIs(t, f.Update(ctx, p1, 1, 9, map[string]any{"fence_token": 100}), lease.ErrInvalid)
	require.ErrorIs(t, f.Update(ctx, p1, 1, 9, map[string]any{"id": 2}), lease.ErrInvalid)
	_, err = lease.NewFence(lease.FenceConfig{Table: "t", KeyColumn: "k", TokenColumn: "k"})
	require.ErrorIs(t, err, lease.ErrInvalid)

	// Inside the caller's transaction: the write rolls back with it.
	tx, err := p1.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, f.Update(ctx, tx, 1, 6, map[string]any{"balance": 40}))
	require.NoError(t, tx.Rollback(ctx))
	assert.Equal(t, 30, queryOne[int](t, p1, "SELECT balance FROM "+accounts))
}

// Tokens increase per resource across release, expiry and takeover, sweep,
// and a restart (new pool, new Manager or Column value).
func TestTokensIncreaseAcrossEverything(t *testing.T) {
	const ttl = 150 * time.Millisecond
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	var tokens []int64

	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: ttl})
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.NoError(t, l.Release(ctx)) // release
	l, err = m.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	l, err = m.Acquire(ctx, "r", nil) // expiry and takeover
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.Eventually(t, func() bool { n, err := m.Sweep(ctx); require.NoError(t, err); return n == 1 }, 10*time.Second, 20*time.Millisecond)
	restarted := newManager(t, pgtest.Pool(t), schema, lease.ManagerConfig{TTL: ttl}) // sweep, then "restart"
	l, err = restarted.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.NoError(t, l.Release(ctx))
	assert.IsIncreasing(t, tokens)

	tokens = nil
	c := usersTable(t, p1, schema, ttl, 1)
	cl, err := c.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	tokens = append(tokens, cl.Token())
	require.NoError(t, cl.Release(ctx))
	cl, err = c.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	tokens = append(tokens, cl.Token())
	require.Eventually(t, func() bool { // expiry and takeover
		cl, err = c.TryAcquire(ctx, int64(1))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	tokens = append(tokens, cl.Token())
	c2, err := lease.NewColumn(pgtest.Pool(t), lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: ttl})
	require.NoError(t, err)
	require.NoError(t, cl.Release(ctx))
	cl, err = c2.TryAcquire(ctx, int64(1)) // "restart"
	require.NoError(t, err)
	tokens = append(tokens, cl.Token())
	require.NoError(t, cl.Release(ctx))
	assert.IsIncreasing(t, tokens)
}
