package advisory_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// The one-pipeline batch form through PgBouncer in transaction mode: the
// whole pipeline (BEGIN ... COMMIT, then the reset) ends with one Sync, so it
// stays on one server connection; the keys exclude a direct session while
// held, a busy key runs nothing, a failed statement keeps nothing.
func TestPgBouncerXactLockBatch(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t, 2)
	pool, direct := bouncerPool(t, b), pgtest.Pool(t)
	lb, ld := newLocker(t, pool, advisory.Config{LockTimeout: 10 * time.Second}), newLocker(t, direct, advisory.Config{})
	k, k2 := int64Key(t), pairKey(t)
	table := pgx.Identifier{pgtest.Schema(t, direct), "rows"}.Sanitize()
	_, err := direct.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, pid int NOT NULL)")
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, direct.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		return n
	}

	// Held through the bouncer while the batch runs: a reader sees the key
	// held by the backend that runs the batch.
	batch := &pgx.Batch{}
	batch.Queue("INSERT INTO " + table + " (id, pid) VALUES (1, pg_backend_pid())")
	var holders int
	batch.Queue(`SELECT count(*) FROM pg_locks l JOIN ` + table + ` r ON r.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted`).
		QueryRow(func(row pgx.Row) error { return row.Scan(&holders) })
	require.NoError(t, lb.WithXactLockBatch(ctx, []keys.Key{k, k2}, nil, batch))
	assert.Equal(t, 2, holders, "both keys held by the batch's backend")
	assert.Equal(t, 1, count())
	assert.True(t, keyFree(t, ctx, direct, k), "released at COMMIT")
	assert.True(t, keyFree(t, ctx, direct, k2))

	// Busy: nothing runs, through the bouncer too.
	h, err := ld.Lock(ctx, k2, nil)
	require.NoError(t, err)
	insert := &pgx.Batch{}
	insert.Queue("INSERT INTO " + table + " (id, pid) VALUES (2, 0)")
	err = lb.TryWithXactLockBatch(ctx, []keys.Key{k, k2}, nil, insert)
	require.ErrorIs(t, err, advisory.ErrNotAcquired)
	err = lb.WithXactLockBatch(ctx, []keys.Key{k2}, &advisory.Options{Timeout: 50 * time.Millisecond}, insert)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	assert.Equal(t, 1, count(), "no write ran")
	assert.True(t, keyFree(t, ctx, direct, k), "the key taken before the busy one was released")
	require.NoError(t, h.Unlock(ctx))

	// A failed statement keeps nothing.
	insert.Queue("INSERT INTO " + table + " (id, pid) VALUES (1, 0)") // duplicate id
	err = lb.WithXactLockBatch(ctx, []keys.Key{k}, nil, insert)
	require.ErrorIs(t, err, pooltx.ErrNotCommitted)
	assert.Equal(t, 1, count())

	// And the bouncer's server connections are usable afterwards.
	insert = &pgx.Batch{}
	insert.Queue("INSERT INTO " + table + " (id, pid) VALUES (3, 0)")
	require.NoError(t, lb.TryWithXactLockBatch(ctx, []keys.Key{k}, nil, insert))
	assert.Equal(t, 2, count())
	assert.Zero(t, pool.Stat().AcquiredConns())
}
