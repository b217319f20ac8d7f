package advisory_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/keys"
)

var errReadOnly = errors.New("read only")

var allExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// serializableConfig is a pool of one connection in exec mode mode whose
// transactions default to serializable (set in the connection's runtime
// parameters, as a DSN would).
func serializableConfig(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Config {
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	cfg.MaxConns = 1
	return cfg
}

// noDeadline is ctx without its deadline (so that a call without a bound
// of its own has none), still cancelled when ctx ends: the test stays
// bounded.
func noDeadline(t testing.TB, ctx context.Context) context.Context {
	uctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	t.Cleanup(func() { stop(); cancel() })
	return uctx
}

func show(ctx context.Context, t testing.TB, tx pgx.Tx, name string) string {
	t.Helper()
	var v string
	// SHOW, not current_setting(): under force_parallel_mode a SELECT runs in a
	// parallel worker, which reports transaction_read_only off in a read-only
	// transaction (PostgreSQL 15).
	require.NoError(t, tx.QueryRow(ctx, "SHOW "+pgx.Identifier{name}.Sanitize()).Scan(&v))
	return v
}

// usable asserts that tx still runs statements, with its own lock_timeout.
func usable(ctx context.Context, t testing.TB, tx pgx.Tx, lockTimeout string) {
	t.Helper()
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction must still be usable")
	assert.Equal(t, lockTimeout, show(ctx, t, tx, "lock_timeout"), "the transaction's own lock_timeout must be as it was")
}

// Every in-tx form in every exec mode, on a pool of one connection whose
// transactions default to serializable: the keys are held by the caller's
// transaction (seen from another session) until it commits; a timeout, a
// busy key or a busy multi-key set leaves nothing of the call held and the
// transaction usable with its own lock_timeout, which the call never changes.
func TestLockInTxAcrossExecModes(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			pool := pgtest.NewPool(t, serializableConfig(t, mode))
			l := newLocker(t, pool, advisory.Config{})
			p := newProbe(t)
			k1, k2, k3, k4, k5 := key(t), keys.Pair(pgtest.UniqueInt32(t), pgtest.UniqueInt32(t)), key(t), key(t), key(t)
			h := hold(ctx, t, false, k3)
			hold(ctx, t, true, k5)

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(context.WithoutCancel(ctx))
			assert.Equal(t, "serializable", show(ctx, t, tx, "transaction_isolation"))
			_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '7s'")
			require.NoError(t, err)

			// Bounded, several keys (both key spaces, a duplicate).
			require.NoError(t, l.LockAllInTx(ctx, tx, []keys.Key{k2, k1, k1}, &advisory.Options{Timeout: 10 * time.Second}))
			assert.False(t, p.free(ctx, k1, false), "held by the caller's transaction")
			assert.False(t, p.free(ctx, k2, true))
			usable(ctx, t, tx, "7s")

			// Unbounded, one key; shared over a shared holder.
			require.NoError(t, l.LockInTx(noDeadline(t, ctx), tx, k4, &advisory.Options{Timeout: -1}))
			k7 := key(t)
			require.NoError(t, l.LockAllInTx(noDeadline(t, ctx), tx, []keys.Key{k7, keys.Pair(pgtest.UniqueInt32(t), 1)}, nil))
			assert.False(t, p.free(ctx, k7, false))
			require.NoError(t, l.TryLockInTx(ctx, tx, k5, &advisory.Options{Shared: true}))
			assert.True(t, p.free(ctx, k5, true), "shared")
			assert.False(t, p.free(ctx, k5, false))

			// A timeout, one key and several.
			err = l.LockInTx(ctx, tx, k3, &advisory.Options{Timeout: 50 * time.Millisecond})
			require.ErrorIs(t, err, advisory.ErrLockTimeout)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			assert.Equal(t, "55P03", pgErr.Code)
			assert.NotErrorIs(t, err, advisory.ErrTxAborted)
			usable(ctx, t, tx, "7s")
			k6 := key(t)
			err = l.LockAllInTx(ctx, tx, []keys.Key{k6, k3}, &advisory.Options{Timeout: 50 * time.Millisecond})
			require.ErrorIs(t, err, advisory.ErrLockTimeout)
			assert.True(t, p.free(ctx, k6, false), "the key taken before the timeout was released")
			usable(ctx, t, tx, "7s")

			// Busy: one key, several.
			err = l.TryLockInTx(ctx, tx, k3, nil)
			require.ErrorIs(t, err, advisory.ErrNotAcquired)
			usable(ctx, t, tx, "7s")
			err = l.TryLockAllInTx(ctx, tx, []keys.Key{k6, k3}, nil)
			require.ErrorIs(t, err, advisory.ErrNotAcquired)
			assert.NotErrorAs(t, err, &pgErr, "the busy signal is not a PostgreSQL error of the caller's")
			assert.True(t, p.free(ctx, k6, false), "all or nothing")
			usable(ctx, t, tx, "7s")
			require.NoError(t, l.TryLockAllInTx(ctx, tx, []keys.Key{k6, key(t)}, nil))
			assert.False(t, p.free(ctx, k6, false))

			// Everything held so far stays held after the failures.
			assert.False(t, p.free(ctx, k1, false))
			assert.False(t, p.free(ctx, k4, false))

			// The transaction's writes and its locks end together.
			require.NoError(t, tx.Commit(ctx))
			for _, k := range []keys.Key{k1, k2, k4, k6} { // k5 stays held shared by its holder
				assert.True(t, p.free(ctx, k, false), "released at COMMIT: %v", k)
			}
			h.release()
			assert.Equal(t, []string{"0"}, showLockTimeouts(ctx, t, pool), "nothing reached the pool's connection")
		})
	}
}

// The same on a single pgx.Conn, and in nested pgx transactions
// (savepoints): a lock taken in a nested transaction that commits (RELEASE
// SAVEPOINT) stays with the outer one; one taken in a nested transaction
// that rolls back goes with it; a failed call inside a nested transaction
// leaves that nested transaction usable.
func TestLockInTxSingleConnAndNestedTx(t *testing.T) {
	ctx := testCtx(t)
	cfg := serializableConfig(t, pgx.QueryExecModeCacheStatement)
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	l := newLocker(t, pgtest.Pool(t), advisory.Config{LockTimeout: 10 * time.Second})
	p := newProbe(t)
	kept, dropped, busy := key(t), key(t), key(t)
	hold(ctx, t, false, busy)

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))

	inner, err := tx.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l.LockInTx(ctx, inner, kept, nil))
	require.NoError(t, inner.Commit(ctx))
	assert.False(t, p.free(ctx, kept, false), "a released savepoint's lock belongs to the outer transaction")

	inner, err = tx.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l.LockAllInTx(ctx, inner, []keys.Key{dropped}, nil))
	err = l.LockInTx(ctx, inner, busy, &advisory.Options{Timeout: 50 * time.Millisecond})
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	usable(ctx, t, inner, "0")
	assert.False(t, p.free(ctx, dropped, false), "a failed call keeps what the nested transaction held")
	require.NoError(t, inner.Rollback(ctx))
	assert.True(t, p.free(ctx, dropped, false), "rolled back with its savepoint")
	assert.False(t, p.free(ctx, kept, false))

	require.NoError(t, tx.Commit(ctx))
	assert.True(t, p.free(ctx, kept, false))
}

// A transaction lock is re-entrant in its own session: the caller's
// transaction may take a key its own session already holds, and another
// session still cannot.
func TestLockInTxReentrantInItsSession(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		require.NoError(t, l.LockInTx(ctx, tx, k, nil))
		require.NoError(t, l.TryLockInTx(ctx, tx, k, nil), "re-entrant in its own session")
		assert.False(t, p.free(ctx, k, false), "excludes another session")
		return nil
	}))
	assert.True(t, p.free(ctx, k, false))
}

// A transaction that cannot take a lock is refused with a clear error and
// no panic: nil, committed, rolled back, ended by its own SQL, aborted, or
// on a closed connection.
func TestLockInTxRefusesWhatIsNotATransaction(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeCacheStatement))
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)

	err := l.LockInTx(ctx, nil, k, nil)
	require.ErrorIs(t, err, advisory.ErrInvalid)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, l.LockInTx(ctx, tx, keys.Key{}, nil), advisory.ErrInvalid)
	require.NoError(t, tx.Commit(ctx))
	for _, try := range []bool{false, true} {
		err = lockInTx(ctx, l, tx, k, try)
		require.ErrorIs(t, err, advisory.ErrInvalid, "committed")
		var le *advisory.LockError
		require.ErrorAs(t, err, &le)
	}

	// Ended by its own SQL: the pgx.Tx is open, the connection is not in
	// a transaction. A try-lock there would be taken and dropped at once.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "COMMIT")
	require.NoError(t, err)
	require.ErrorIs(t, l.TryLockInTx(ctx, tx, k, nil), advisory.ErrInvalid)
	require.ErrorIs(t, l.LockAllInTx(ctx, tx, []keys.Key{k, key(t)}, nil), advisory.ErrInvalid)
	_ = tx.Rollback(ctx)

	// Aborted by an earlier error.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1/0")
	require.Error(t, err)
	err = l.LockInTx(ctx, tx, k, nil)
	require.ErrorIs(t, err, advisory.ErrTxAborted)
	require.NoError(t, tx.Rollback(ctx))

	// A committed transaction whose connection has begun another one: pgx
	// refuses the closed pgx.Tx.
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	old, err := c.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, old.Commit(ctx))
	cur, err := c.Begin(ctx)
	require.NoError(t, err)
	err = l.LockInTx(ctx, old, k, nil)
	require.ErrorIs(t, err, advisory.ErrInvalid)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.NoError(t, cur.Rollback(ctx))
	c.Release()

	// A closed connection.
	conn, err := pgx.ConnectConfig(ctx, pgtest.Config(t).ConnConfig)
	require.NoError(t, err)
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.ErrorIs(t, l.LockInTx(ctx, tx, k, nil), advisory.ErrTxAborted)
}

func lockInTx(ctx context.Context, l *advisory.Locker, tx pgx.Tx, k keys.Key, try bool) error {
	if try {
		return l.TryLockInTx(ctx, tx, k, nil)
	}
	return l.LockInTx(ctx, tx, k, nil)
}

// A cancelled wait ends with the context's error; a deadline becomes the
// server's lock_timeout (ErrLockTimeout with DeadlineExceeded). Either way
// the caller's transaction is usable, with its own lock_timeout, its
// connection is kept, and the key is not held.
func TestLockInTxCancelAndDeadline(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeCacheDescribe))
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	h := hold(ctx, t, false, k)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '1h'")
	require.NoError(t, err)
	pid := tx.Conn().PgConn().PID()

	cctx, cancel := context.WithCancel(noDeadline(t, ctx)) // an unbounded wait
	done := make(chan error, 1)
	go func() { done <- l.LockInTx(cctx, tx, k, nil) }()
	awaitWaiting(ctx, t, p.pool, k, 1)
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, advisory.ErrTxAborted)
	usable(ctx, t, tx, "1h")

	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	err = l.LockInTx(dctx, tx, k, nil)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	usable(ctx, t, tx, "1h")
	assert.Equal(t, pid, tx.Conn().PgConn().PID())

	// An ended context sends nothing.
	err = l.LockInTx(cctx, tx, k, nil)
	require.ErrorIs(t, err, context.Canceled)
	err = l.TryLockInTx(cctx, tx, k, nil)
	require.ErrorIs(t, err, context.Canceled)
	usable(ctx, t, tx, "1h")

	h.release()
	require.NoError(t, l.LockInTx(ctx, tx, k, &advisory.Options{Timeout: time.Minute}))
	assert.False(t, p.free(ctx, k, false))
	require.NoError(t, tx.Commit(ctx))
}

// A bound past PostgreSQL's largest lock_timeout (2^31-1 ms) is clamped:
// the call succeeds instead of failing with 22023.
func TestLockInTxHugeTimeoutIsClamped(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	l := newLocker(t, pool, advisory.Config{LockTimeout: 1000 * time.Hour})
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, l.LockInTx(ctx, tx, key(t), nil))
		require.NoError(t, l.LockAllInTx(ctx, tx, []keys.Key{key(t), key(t)}, &advisory.Options{Timeout: 10000 * time.Hour}))
		usable(ctx, t, tx, "0")
		return nil
	}))
}

// In-tx calls are traced as the other transaction-scope calls: a start and
// an end with ScopeXact and the outcome, no release.
func TestLockInTxTraced(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	rec := &recorder{}
	l := newLocker(t, pool, advisory.Config{Tracer: rec})
	k, busy := key(t), key(t)
	hold(ctx, t, false, busy)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, l.LockAllInTx(ctx, tx, []keys.Key{k, k}, nil))
		require.ErrorIs(t, l.TryLockInTx(ctx, tx, busy, nil), advisory.ErrNotAcquired)
		require.ErrorIs(t, l.LockInTx(ctx, tx, busy, &advisory.Options{Timeout: 20 * time.Millisecond}), advisory.ErrLockTimeout)
		return nil
	}))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, []string{"start:xact", "end:acquired", "start:xact", "end:busy", "start:xact", "end:timeout"}, rec.events)
	require.Len(t, rec.ends, 3)
	assert.Equal(t, []keys.Key{k}, rec.ends[0].Keys, "sorted and de-duplicated")
	assert.True(t, rec.ends[1].Try)
}

// Options.TxOptions reach BEGIN of WithXactLock, in BEGIN's round trip,
// over a serializable default; nil options keep the default.
func TestWithXactLockTxOptions(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			pool := pgtest.NewPool(t, serializableConfig(t, mode))
			l := newLocker(t, pool, advisory.Config{})
			require.NoError(t, l.WithXactLock(ctx, key(t), nil, func(ctx context.Context, tx pgx.Tx) error {
				assert.Equal(t, "serializable", show(ctx, t, tx, "transaction_isolation"))
				assert.Equal(t, "off", show(ctx, t, tx, "transaction_read_only"))
				return nil
			}))
			opts := &advisory.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}}
			err := l.WithXactLockAll(ctx, []keys.Key{key(t), key(t)}, opts, func(ctx context.Context, tx pgx.Tx) error {
				assert.Equal(t, "read committed", show(ctx, t, tx, "transaction_isolation"))
				assert.Equal(t, "on", show(ctx, t, tx, "transaction_read_only"))
				_, err := tx.Exec(ctx, "CREATE TEMP TABLE t (x int)")
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				assert.Equal(t, "25006", pgErr.Code, "read only")
				return errReadOnly
			})
			require.ErrorIs(t, err, errReadOnly)
			opts = &advisory.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead, DeferrableMode: pgx.Deferrable}}
			require.NoError(t, l.TryWithXactLock(ctx, key(t), opts, func(ctx context.Context, tx pgx.Tx) error {
				assert.Equal(t, "repeatable read", show(ctx, t, tx, "transaction_isolation"))
				assert.Equal(t, "on", show(ctx, t, tx, "transaction_deferrable"))
				return nil
			}))
		})
	}
}

// A deadlock between two callers' transactions that took their keys in
// separate calls is reported to its victim as ErrDeadlock (40P01), and the
// victim's transaction stays usable: only the call's own savepoint was
// rolled back, so its earlier key stays held until it ends, and then the
// survivor gets its key.
func TestLockInTxDeadlockLeavesTxUsable(t *testing.T) {
	ctx := testCtx(t)
	cfg := serializableConfig(t, pgx.QueryExecModeCacheStatement)
	cfg.MaxConns = 2
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: time.Minute})
	k1, k2 := key(t), key(t)
	txs := [2]pgx.Tx{}
	for i, k := range []keys.Key{k1, k2} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.WithoutCancel(ctx))
		require.NoError(t, l.LockInTx(ctx, tx, k, nil))
		txs[i] = tx
	}
	type result struct {
		i   int
		err error
	}
	results := make(chan result, 2)
	go func() { results <- result{0, l.LockInTx(ctx, txs[0], k2, nil)} }()
	go func() { results <- result{1, l.LockInTx(ctx, txs[1], k1, nil)} }()
	victim := <-results
	require.ErrorIs(t, victim.err, advisory.ErrDeadlock)
	usable(ctx, t, txs[victim.i], "0")
	require.NoError(t, txs[victim.i].Commit(ctx))
	survivor := <-results
	require.NoError(t, survivor.err)
	require.NoError(t, txs[survivor.i].Commit(ctx))
}

// Round trips of the in-tx forms once their statements are prepared: one
// when the keys are granted (and for a busy single-key try); one more, the
// ROLLBACK TO SAVEPOINT, when a wait or a multi-key try fails. pgx's
// QueryExecModeDescribeExec adds its describe round trip to every batch,
// and the caching modes re-prepare a batch that failed.
func TestLockInTxRoundTrips(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			var counter roundtrip.Counter
			cfg := serializableConfig(t, mode)
			cfg.ConnConfig.DialFunc = counter.DialFunc
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{LockTimeout: 10 * time.Second})
			busy := key(t)
			hold(ctx, t, false, busy)
			// pgx's describe round trip on every batch (DescribeExec); after
			// a failed batch, its statements are dropped from pgx's caches,
			// so the next failure describes (CacheDescribe) or deallocates
			// and prepares (CacheStatement) them again.
			extra, failExtra := int64(0), int64(0)
			switch mode {
			case pgx.QueryExecModeDescribeExec:
				extra, failExtra = 1, 1
			case pgx.QueryExecModeCacheDescribe:
				failExtra = 1
			case pgx.QueryExecModeCacheStatement:
				failExtra = 2
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(context.WithoutCancel(ctx))
			measure := func(name string, want int64, call func() error) {
				t.Helper()
				_ = call() // prepares statements
				counter.Reset()
				_ = call()
				assert.Equal(t, want, counter.Count(), name)
			}
			many := []keys.Key{key(t), key(t), keys.Pair(pgtest.UniqueInt32(t), 2)} // unique: other packages run at once
			measure("lock", 1+extra, func() error { return l.LockInTx(ctx, tx, key(t), nil) })
			measure("lock all", 1+extra, func() error { return l.LockAllInTx(ctx, tx, many, nil) })
			uctx := noDeadline(t, ctx)
			unbounded := &advisory.Options{Timeout: -1}
			measure("lock unbounded", 1+extra, func() error { return l.LockInTx(uctx, tx, key(t), unbounded) })
			measure("lock all unbounded", 1+extra, func() error { return l.LockAllInTx(uctx, tx, many, unbounded) })
			measure("try", 1+extra, func() error { return l.TryLockInTx(ctx, tx, key(t), nil) })
			measure("try all", 1+extra, func() error { return l.TryLockAllInTx(ctx, tx, many, nil) })
			measure("try busy", 1+extra, func() error { return l.TryLockInTx(ctx, tx, busy, nil) })
			measure("try all busy", 2+failExtra, func() error { return l.TryLockAllInTx(ctx, tx, []keys.Key{key(t), busy}, nil) })
			measure("timeout", 2+failExtra, func() error {
				return l.LockInTx(ctx, tx, busy, &advisory.Options{Timeout: 20 * time.Millisecond})
			})
		})
	}
}

// Without a bound of the call's own, the transaction's lock_timeout ends
// the wait (ErrLockTimeout), and the transaction keeps it; a bounded call
// sets back the session's default (here from the connection's runtime
// parameters) as well as a SET LOCAL.
func TestLockInTxWithoutBoundTheTxLockTimeoutApplies(t *testing.T) {
	ctx := testCtx(t)
	cfg := serializableConfig(t, pgx.QueryExecModeCacheStatement)
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "9s"
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	busy := key(t)
	hold(ctx, t, false, busy)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, l.LockInTx(ctx, tx, key(t), &advisory.Options{Timeout: time.Minute}))
		usable(ctx, t, tx, "9s")
		_, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'")
		require.NoError(t, err)
		err = l.LockAllInTx(noDeadline(t, ctx), tx, []keys.Key{busy, key(t)}, nil)
		require.ErrorIs(t, err, advisory.ErrLockTimeout)
		usable(ctx, t, tx, "100ms")
		err = l.LockInTx(noDeadline(t, ctx), tx, busy, nil)
		require.ErrorIs(t, err, advisory.ErrLockTimeout)
		usable(ctx, t, tx, "100ms")
		return nil
	}))
	assert.Equal(t, []string{"9s"}, showLockTimeouts(ctx, t, pool))
}

// A caller's transaction whose backend is terminated while the call waits
// is reported as ErrTxAborted: it cannot be used any more.
func TestLockInTxTerminatedBackendIsErrTxAborted(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	hold(ctx, t, false, k)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	pid := tx.Conn().PgConn().PID()
	done := make(chan error, 1)
	go func() { done <- l.LockInTx(ctx, tx, k, nil) }()
	awaitWaiting(ctx, t, p.pool, k, 1)
	var ok bool
	require.NoError(t, p.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
	err = <-done
	require.ErrorIs(t, err, advisory.ErrTxAborted)
	var le *advisory.LockError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "xact-lock", le.Op)
}

// An in-tx call waits on the server even while another call of the same
// Locker waits for the key (which queues later calls of the Locker in
// process): PostgreSQL sees both waiters, and its deadlock detector sees
// the caller's transaction.
func TestLockInTxWaitsOnTheServerNotInTheLocalQueue(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	other := pgtest.Pool(t)
	l := newLocker(t, other, advisory.Config{})
	p := newProbe(t)
	k := key(t)
	h := hold(ctx, t, false, k)
	first := make(chan error, 1)
	go func() {
		first <- l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
	}()
	awaitWaiting(ctx, t, p.pool, k, 1)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	second := make(chan error, 1)
	go func() { second <- l.LockInTx(ctx, tx, k, nil) }()
	awaitWaiting(ctx, t, p.pool, k, 2)
	h.release()
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	require.NoError(t, tx.Commit(ctx))
}

// A multi-key in-tx call that fills the server's lock table fails with
// ErrTooManyLocks (53200), leaves nothing of it held and the caller's
// transaction usable, its earlier keys still held. A private cluster with
// a tiny lock table (see TestLockTableExhaustionLeavesNothingHeld).
func TestLockInTxLockTableExhaustionLeavesTxUsable(t *testing.T) {
	ctx := testCtx(t)
	cluster := startTinyLockTableCluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	monitor := pgtest.NewPool(t, mustParse(t, cluster.DSN()))
	l := newLocker(t, pool, advisory.Config{MaxKeys: 2 * capacityKeys})
	base := pgtest.UniqueInt64(t)
	ks := make([]keys.Key, capacityKeys)
	for i := range ks {
		ks[i] = keys.Int64(base ^ int64(i))
	}
	first := key(t)
	count := func() int {
		var n int
		require.NoError(t, monitor.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n))
		return n
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, l.LockInTx(ctx, tx, first, nil))
		err := l.LockAllInTx(ctx, tx, ks, nil)
		require.ErrorIs(t, err, advisory.ErrTooManyLocks)
		assert.NotErrorIs(t, err, advisory.ErrTxAborted)
		usable(ctx, t, tx, "0")
		assert.Equal(t, 1, count(), "only the earlier key is held")
		require.NoError(t, l.LockAllInTx(ctx, tx, ks[:50], nil))
		assert.Equal(t, 51, count())
		return nil
	}))
	assert.Zero(t, count())
}

// Options.TxOptions cost no round trip: BEGIN with them still travels
// with the lock.
func TestWithXactLockTxOptionsRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	var counter roundtrip.Counter
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = counter.DialFunc
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{LockTimeout: time.Second})
	opts := &advisory.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadOnly, DeferrableMode: pgx.Deferrable}}
	call := func() error {
		return l.WithXactLock(ctx, key(t), opts, func(context.Context, pgx.Tx) error { return nil })
	}
	require.NoError(t, call())
	counter.Reset()
	require.NoError(t, call())
	assert.EqualValues(t, 2, counter.Count(), "BEGIN+lock, COMMIT")
}

// The bound of LockAllInTx is the whole call's, all keys together: a third
// of it spent on the first key, the second stays busy, and the server ends
// the wait at the bound with 55P03 (a bound applied to each key afresh
// would outlast the client's deadline by more than its grace, and the
// socket would be cut: ErrTxAborted). The transaction stays usable.
func TestLockAllInTxTimeoutIsTheWholeCalls(t *testing.T) {
	ctx := testCtx(t)
	const bound = 3 * time.Second
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeExec))
	l := newLocker(t, pool, advisory.Config{})
	p := newProbe(t)
	ks := keys.Normalize([]keys.Key{key(t), keys.Pair(int32(pgtest.UniqueInt64(t)), -1)})
	h1 := hold(ctx, t, false, ks[0])
	hold(ctx, t, false, ks[1])
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))

	done := make(chan error, 1)
	go func() { done <- l.LockAllInTx(ctx, tx, ks, &advisory.Options{Timeout: bound}) }()
	awaitWaitedFor(ctx, t, p.pool, ks[0], bound/3)
	h1.release()
	err = <-done
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server ended the wait")
	assert.Equal(t, "55P03", pgErr.Code)
	assert.NotErrorIs(t, err, advisory.ErrTxAborted)
	usable(ctx, t, tx, "0")
	assert.True(t, p.free(ctx, ks[0], false), "the key taken before the timeout was released")
}

// Options.TxOptions that pgx would write into BEGIN unquoted, or that
// would replace the call's own BEGIN or COMMIT, are refused before any SQL:
// the callback does not run, nothing is committed.
func TestWithXactLockTxOptionsRefusesUnknownValues(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, serializableConfig(t, pgx.QueryExecModeSimpleProtocol))
	l := newLocker(t, pool, advisory.Config{})
	for name, o := range map[string]pgx.TxOptions{
		"BeginQuery":     {BeginQuery: "BEGIN; COMMIT"},
		"CommitQuery":    {CommitQuery: "ROLLBACK"},
		"IsoLevel":       {IsoLevel: "serializable; commit"},
		"AccessMode":     {AccessMode: "read write; commit"},
		"DeferrableMode": {DeferrableMode: "deferrable; commit"},
	} {
		err := l.WithXactLock(ctx, key(t), &advisory.Options{TxOptions: o}, func(context.Context, pgx.Tx) error {
			t.Errorf("%s: the callback ran", name)
			return nil
		})
		require.ErrorIs(t, err, advisory.ErrInvalid, name)
		var le *advisory.LockError
		require.ErrorAs(t, err, &le, name)
	}
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// The caller's backend is frozen (SIGSTOP) while the call waits, so it can
// answer neither the wait nor the cancel request: after the grace period
// the call cuts the socket, returns, and says the transaction is gone
// (ErrTxAborted, with ctx's error). A private cluster, so that the frozen
// backend bothers nobody else.
func TestLockInTxCancelledOnFrozenBackendIsErrTxAborted(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.Cluster(t)
	cfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 1
	acfg, err := pgxpool.ParseConfig(cluster.DSN())
	require.NoError(t, err)
	pool, admin := pgtest.NewPool(t, cfg), pgtest.NewPool(t, acfg)
	l := newLocker(t, pool, advisory.Config{})
	k := key(t)
	v, _ := k.Int64()
	holder, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", v)
	require.NoError(t, err)
	defer holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_all()") //nolint:errcheck

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	pid := tx.Conn().PgConn().PID()
	wctx, cancel := context.WithCancel(noDeadline(t, ctx))
	done := make(chan error, 1)
	go func() { done <- l.LockInTx(wctx, tx, k, nil) }()
	classid, objid, objsubid := k.PgLocks()
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3 AND pid = $4`, classid, objid, objsubid, pid).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGSTOP))
	defer syscall.Kill(int(pid), syscall.SIGCONT) //nolint:errcheck
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, err, advisory.ErrTxAborted)
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled wait on a frozen backend did not return")
	}
	assert.True(t, tx.Conn().IsClosed(), "the connection in doubt is closed")
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGCONT))
}
