package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// capacityKeys is well above what the private cluster's lock table holds
// (max_locks_per_transaction 10 x about 42 backend slots, plus the shared
// memory slack the hash table may grow into).
const capacityKeys = 4000

// A multi-key call that fills the server's shared lock table fails with
// 53200 part-way through its statement. It must leave nothing held, in
// either scope, and the pool must keep working. This runs on a private
// cluster with a tiny lock table: a full lock table impairs every session
// of a cluster, so the shared test server is never used for it.
func TestLockTableExhaustionLeavesNothingHeld(t *testing.T) {
	ctx := testCtx(t)
	cluster := startTinyLockTableCluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool := pgtest.NewPool(t, cfg)
	monitor := pgtest.NewPool(t, mustParse(t, cluster.DSN()))

	var capacity int
	require.NoError(t, monitor.QueryRow(ctx,
		"SELECT current_setting('max_locks_per_transaction')::int * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)").Scan(&capacity))
	t.Logf("private cluster: max_locks_per_transaction x (max_connections + max_prepared_transactions) = %d; asking for %d keys", capacity, capacityKeys)

	l := newLocker(t, pool, advisory.Config{MaxKeys: 2 * capacityKeys})
	base := pgtest.UniqueInt64(t)
	ks := make([]keys.Key, capacityKeys)
	for i := range ks {
		ks[i] = keys.Int64(base ^ int64(i)) // distinct: i < 2^12
	}

	check := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, advisory.ErrTooManyLocks)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "53200", pgErr.Code)
		var le *advisory.LockError
		require.ErrorAs(t, err, &le)
		assert.Len(t, le.Keys, capacityKeys)
		t.Logf("%v (hint: %s)", pgErr.Message, pgErr.Hint)

		var held int
		require.NoError(t, monitor.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&held))
		assert.Zero(t, held, "no advisory lock left anywhere in the cluster")
		assert.EqualValues(t, 0, pool.Stat().AcquiredConns())

		// The pool and the lock table work again.
		var one int
		require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
		require.NoError(t, l.WithLockAll(ctx, ks[:50], nil, func(context.Context, *pgx.Conn) error { return nil }))
		require.NoError(t, l.WithXactLockAll(ctx, ks[:50], nil, func(context.Context, pgx.Tx) error { return nil }))
	}

	t.Run("WithLockAll", func(t *testing.T) {
		err := l.WithLockAll(ctx, ks, nil, func(context.Context, *pgx.Conn) error {
			t.Error("the callback ran without every lock")
			return nil
		})
		check(t, err)
	})
	t.Run("WithXactLockAll", func(t *testing.T) {
		err := l.WithXactLockAll(ctx, ks, nil, func(context.Context, pgx.Tx) error {
			t.Error("the callback ran without every lock")
			return nil
		})
		check(t, err)
	})
	t.Run("shared WithLockAll", func(t *testing.T) {
		err := l.WithLockAll(ctx, ks, &advisory.Options{Shared: true}, func(context.Context, *pgx.Conn) error {
			t.Error("the callback ran without every lock")
			return nil
		})
		check(t, err)
	})
}

func startTinyLockTableCluster(t *testing.T) *pglaunch.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pglaunch.Start(ctx, pglaunch.Options{Settings: map[string]string{
		"max_locks_per_transaction": "10",
		"max_connections":           "20",
	}})
	if errors.Is(err, pglaunch.ErrNoBinaries) {
		t.Fatalf("this test needs a private cluster with a tiny lock table, so it needs the PostgreSQL server binaries: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, c.Stop(ctx))
	})
	return c
}

func mustParse(t *testing.T, dsn string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 1
	return cfg
}

// The package doc: a statement on a holder connection that holds other
// locks is bounded by HeartbeatTimeout plus 20 µs for each key beyond the
// first 1,000. The undo of a 40,000-key TryLockAll that failed with 53200
// unlocks every key of the call (each one not held costs the server a
// WARNING); under a 100 ms bound alone it outlasted it, and the holder
// connection was lost with the other lock on it (review 30h).
func TestALargeFailedTryOnAHolderKeepsItsOtherLocks(t *testing.T) {
	ctx := testCtx(t)
	cluster := startTinyLockTableCluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool := pgtest.NewPool(t, cfg)
	const n = 40000
	l := newLocker(t, pool, advisory.Config{MaxKeys: n, HeartbeatTimeout: 100 * time.Millisecond})
	base := pgtest.UniqueInt64(t) &^ 0xffff
	h, err := l.TryLock(ctx, keys.Int64(base^0xffff), nil) // the holder connection's other lock
	require.NoError(t, err)
	ks := make([]keys.Key, n)
	for i := range ks {
		ks[i] = keys.Int64(base ^ int64(i)) // distinct: i < 2^16 - 1
	}
	h2, err := l.TryLockAll(ctx, ks, nil)
	if err == nil {
		_ = h2.Unlock(ctx)
	}
	require.ErrorIs(t, err, advisory.ErrTooManyLocks)
	select {
	case <-h.Done():
		t.Fatalf("the other lock was lost: %v", h.Err())
	default:
	}
	require.NoError(t, h.Unlock(ctx))
}
