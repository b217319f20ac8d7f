package pgxlockgoose_test

import (
	"context"
	"database/sql"
	"errors"
	"hash/crc32"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The default key is goose's: its lock.DefaultLockID, the CRC-32 of "goose".
func TestDefaultKeyIsGoosesLockID(t *testing.T) {
	require.Equal(t, int64(4097083626), lock.DefaultLockID)
	require.Equal(t, uint32(lock.DefaultLockID), crc32.ChecksumIEEE([]byte("goose")))
	require.Equal(t, keys.Int64(lock.DefaultLockID), pgxlockgoose.GooseKey)
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{})
	require.NoError(t, err)
	require.Equal(t, pgxlockgoose.GooseKey, l.Key())
}

// With default settings on both sides, goose's own session locker and this
// package's exclude each other.
func TestDefaultKeyExcludesGoosesOwnLocker(t *testing.T) {
	ctx := testCtx(t)
	db, _ := openDB(t, 2)
	c1, c2 := twoConns(t, ctx, db)

	theirs, err := lock.NewPostgresSessionLocker()
	require.NoError(t, err)
	ours, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{LockTimeout: 50 * time.Millisecond})
	require.NoError(t, err)

	require.NoError(t, theirs.SessionLock(ctx, c1))
	err = ours.SessionLock(ctx, c2)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	require.NoError(t, theirs.SessionUnlock(ctx, c1))
	require.NoError(t, ours.SessionLock(ctx, c2))
	require.NoError(t, ours.SessionUnlock(ctx, c2))
}

// goose's table locker (lock.NewPostgresTableLocker) holds a row of its lock
// table, not an advisory lock: with the same lock id it and this package's
// locker do NOT exclude each other, as the package doc says. Both are held
// at once here.
func TestTableLockerDoesNotExcludeSessionLocker(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	db, _ := openDB(t, 2)
	id := pgtest.UniqueInt64(t) & math.MaxInt64 // goose wants a positive id
	if id == 0 {
		id = 1
	}

	table, err := lock.NewPostgresTableLocker(lock.WithTableName(schema+".goose_lock"), lock.WithTableLockID(id))
	require.NoError(t, err)
	require.NoError(t, table.Lock(ctx, db))
	defer func() { require.NoError(t, table.Unlock(ctx, db)) }()

	ours, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(id), LockTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, ours.SessionLock(ctx, c), "the table locker's row does not block the advisory lock")
	require.NoError(t, ours.SessionUnlock(ctx, c))
}

// 8 goroutines, each with its own provider and pool, run Up at once: every
// migration is applied exactly once and every caller returns nil.
func TestConcurrentUpAppliesEachMigrationOnce(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	k := keys.Int64(pgtest.UniqueInt64(t))
	runUps(t, ctx, schema, 8, 2, func(i int, pool *pgxpool.Pool) goose.ProviderOption {
		l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k})
		require.NoError(t, err)
		return goose.WithSessionLocker(l)
	})
}

// Each caller's database/sql handle has a single connection: goose runs the
// SQL migrations on the connection that holds the lock.
func TestConcurrentUpPoolOfOne(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	k := keys.Int64(pgtest.UniqueInt64(t))
	runUps(t, ctx, schema, 4, 1, func(i int, pool *pgxpool.Pool) goose.ProviderOption {
		l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k})
		require.NoError(t, err)
		return goose.WithSessionLocker(l)
	})
}

// A fleet half-way through a rollout: 4 callers on goose's own session
// locker and 4 on this package's, same key, Up at once. They exclude each
// other: each migration runs once, all return nil.
func TestMixedFleetGooseAndPgxlockLockers(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	id := pgtest.UniqueInt64(t)
	runUps(t, ctx, schema, 8, 2, func(i int, pool *pgxpool.Pool) goose.ProviderOption {
		if i%2 == 0 {
			return goose.WithSessionLocker(gooseOwn(t, id))
		}
		l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(id)})
		require.NoError(t, err)
		return goose.WithSessionLocker(l)
	})
}

// The Locker form (goose.WithLocker), on advisory lock handles, under the
// same load.
func TestConcurrentUpWithHandleLocker(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	k := keys.Int64(pgtest.UniqueInt64(t))
	runUps(t, ctx, schema, 8, 2, func(i int, pool *pgxpool.Pool) goose.ProviderOption {
		al, err := advisory.New(pool, advisory.Config{}) // the provider's own pool (MaxConns 2)
		require.NoError(t, err)
		l, err := pgxlockgoose.NewLocker(al, pgxlockgoose.Config{Key: k})
		require.NoError(t, err)
		return goose.WithLocker(l)
	})
}

// twoConns returns two connections of db (two sessions), closed at cleanup.
func twoConns(t *testing.T, ctx context.Context, db *sql.DB) (*sql.Conn, *sql.Conn) {
	var cs [2]*sql.Conn
	for i := range cs {
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs[0], cs[1]
}

// runUps starts n callers of Up, each on its own pool and provider, released
// together, and checks the outcome.
func runUps(t *testing.T, ctx context.Context, schema string, n int, maxConns int32, locker func(i int, pool *pgxpool.Pool) goose.ProviderOption) {
	var ps []*goose.Provider
	var check *pgxPool
	for i := range n {
		db, pool := openDB(t, maxConns)
		if check == nil {
			check = &pgxPool{pool}
		}
		p := provider(t, db, schema, locker(i, pool))
		// Create goose's version table first, one provider after another:
		// goose retries a failed creation after a second, which would
		// stagger the callers and hide a missing lock.
		_, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = p.Up(ctx)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "caller %d", i)
	}
	checkAppliedOnce(t, ctx, check.Pool, schema)
}

type pgxPool struct{ *pgxpool.Pool }

// A wait longer than Config.LockTimeout ends with ErrLockTimeout (SQLSTATE
// 55P03 in the chain) on a connection that stays usable and holds nothing.
func TestLockTimeoutKeepsConnection(t *testing.T) {
	ctx := testCtx(t)
	db, pool := openDB(t, 2)
	k := keys.Int64(pgtest.UniqueInt64(t))
	holder, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k})
	require.NoError(t, err)
	waiter, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k, LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	c1, c2 := twoConns(t, ctx, db)

	require.NoError(t, holder.SessionLock(ctx, c1))
	err = waiter.SessionLock(ctx, c2)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	var lt string
	rawConn(t, c2, func(c *pgx.Conn) {
		require.False(t, c.IsClosed())
		require.NoError(t, c.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt))
	})
	require.Equal(t, "0", lt, "the lock statement's lock_timeout must not outlive it")
	require.NoError(t, holder.SessionUnlock(ctx, c1))
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

// A context deadline becomes the server-side lock_timeout: ErrLockTimeout
// and context.DeadlineExceeded, connection kept.
func TestDeadlineBecomesLockTimeout(t *testing.T) {
	ctx := testCtx(t)
	db, _ := openDB(t, 2)
	k := keys.Int64(pgtest.UniqueInt64(t))
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k})
	require.NoError(t, err)
	c1, c2 := twoConns(t, ctx, db)
	require.NoError(t, l.SessionLock(ctx, c1))
	defer func() { require.NoError(t, l.SessionUnlock(ctx, c1)) }()

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = l.SessionLock(dctx, c2)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	rawConn(t, c2, func(c *pgx.Conn) { require.False(t, c.IsClosed()) })
}

// Cancelling a waiting SessionLock ends the wait at once: the waiter leaves
// PostgreSQL's queue and its connection, in doubt, is closed.
func TestCancelledWaitDestroysConnection(t *testing.T) {
	ctx := testCtx(t)
	db, pool := openDB(t, 2)
	id := pgtest.UniqueInt64(t)
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(id)})
	require.NoError(t, err)
	c1, c2 := twoConns(t, ctx, db)
	require.NoError(t, l.SessionLock(ctx, c1))

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.SessionLock(cctx, c2) }()
	check := pgtest.Pool(t)
	poll(t, "the waiter in pg_locks", func() bool { return waiters(t, ctx, check, id) == 1 })
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	rawConn(t, c2, func(c *pgx.Conn) { require.True(t, c.IsClosed()) })
	poll(t, "the waiter to leave pg_locks", func() bool { return waiters(t, ctx, check, id) == 0 })
	require.NoError(t, l.SessionUnlock(ctx, c1))
	_ = pool
}

// An unlock PostgreSQL answers false (the lock was not held) is
// ErrNotHeld, and the connection is closed rather than pooled.
func TestUnlockNotHeldIsErrorAndDestroys(t *testing.T) {
	ctx := testCtx(t)
	db, _ := openDB(t, 1)
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(pgtest.UniqueInt64(t))})
	require.NoError(t, err)
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	err = l.SessionUnlock(ctx, c)
	require.ErrorIs(t, err, advisory.ErrNotHeld)
	var le *advisory.LockError
	require.True(t, errors.As(err, &le))
	rawConn(t, c, func(c *pgx.Conn) { require.True(t, c.IsClosed()) })
}

// SessionUnlock's doc: the connection is closed after the unlock, also
// when it succeeds, so that what a NO TRANSACTION migration left on it (the
// goose key taken again, another session lock, a role) never reaches
// database/sql's pool (review 31k: the stacked key stayed held by a pooled
// connection, and every later Up timed out).
func TestUnlockClosesTheConnectionWhateverTheMigrationsLeft(t *testing.T) {
	ctx := testCtx(t)
	db, _ := openDB(t, 1)
	k := pgtest.UniqueInt64(t)
	other := pgtest.UniqueInt64(t)
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(k)})
	require.NoError(t, err)
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	require.NoError(t, l.SessionLock(ctx, c))
	// What a NO TRANSACTION migration may do on goose's connection.
	_, err = c.ExecContext(ctx, "SELECT pg_advisory_lock($1), pg_advisory_lock($2)", k, other)
	require.NoError(t, err)
	require.NoError(t, l.SessionUnlock(ctx, c))
	rawConn(t, c, func(c *pgx.Conn) { require.True(t, c.IsClosed()) })
	require.NoError(t, c.Close())
	check := pgtest.Pool(t)
	for _, key := range []int64{k, other} {
		poll(t, "the key to be free", func() bool {
			var free bool
			require.NoError(t, check.QueryRow(ctx, "SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)", key).Scan(&free))
			return free
		})
	}
}
