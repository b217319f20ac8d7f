package pgxlockmigrate_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockmigrate "github.com/pgxlock/pgxlock/contrib/migrate"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The default key is golang-migrate's own lock id, computed by its
// database.GenerateAdvisoryLockId from the same names.
func TestKeyIsGolangMigratesLockID(t *testing.T) {
	cases := []struct {
		db, schema, table string
		quoted            bool
		// what the stock driver passes GenerateAdvisoryLockId
		wantSchema, wantTable string
	}{
		{"test", "public", "", false, "public", "schema_migrations"},
		{"test", "public", "schema_migrations", false, "public", "schema_migrations"},
		{"app", "tenant_7", "versions", false, "tenant_7", "versions"},
		{"app", "public", `"other"."versions"`, true, "other", "versions"},
		{"app", "public", `"versions"`, true, "public", "versions"},
		{"ünïcode", "s p a c e", "t\x01", false, "s p a c e", "t\x01"},
	}
	for _, c := range cases {
		got, err := pgxlockmigrate.Key(c.db, c.schema, c.table, c.quoted)
		require.NoError(t, err)
		id, err := database.GenerateAdvisoryLockId(c.db, c.wantSchema, c.wantTable)
		require.NoError(t, err)
		n, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		assert.Equal(t, keys.Int64(n), got, "%+v", c)
	}
	for _, bad := range []struct {
		db, schema, table string
		quoted            bool
	}{{"", "public", "", false}, {"db", "", "", false}, {"db", "public", "unquoted", true}, {"db", "public", `"a"."b"."c"`, true}} {
		_, err := pgxlockmigrate.Key(bad.db, bad.schema, bad.table, bad.quoted)
		assert.ErrorIs(t, err, advisory.ErrInvalid, "%+v", bad)
	}
}

func TestWrapRefusesBadInput(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, true, pgxlockmigrate.Config{})
	_, err := pgxlockmigrate.Wrap(ctx, nil, r.pool, pgxlockmigrate.Config{})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
	_, err = pgxlockmigrate.Wrap(ctx, r.inner, nil, pgxlockmigrate.Config{})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
	_, err = pgxlockmigrate.Wrap(ctx, r.inner, r.pool, pgxlockmigrate.Config{LockTimeout: -time.Second})
	assert.ErrorIs(t, err, advisory.ErrInvalid)
}

// Replicas starting together, this package's drivers and the stock one
// mixed, apply every migration exactly once.
func TestReplicasRacingUpApplyEachMigrationOnce(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 5, 0)
	var rs []*replica
	for i := range 6 {
		rs = append(rs, f.replica(t, ctx, i%3 == 2, pgxlockmigrate.Config{}))
	}
	start := make(chan struct{})
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			<-start
			errs[i] = r.m.Up()
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		assert.True(t, isNoChange(err), "replica %d: %v", i, err)
	}
	assert.Equal(t, map[int]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 1}, f.counts(t))
}

// The stock driver's lock and this package's are one lock: while the stock
// driver holds it, an Up through this package times out.
func TestStockDriverExcludesThisOne(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	stock := f.replica(t, ctx, true, pgxlockmigrate.Config{})
	ours := f.replica(t, ctx, false, pgxlockmigrate.Config{LockTimeout: 300 * time.Millisecond})
	require.NoError(t, stock.inner.Lock())
	err := ours.m.Up()
	assert.ErrorIs(t, err, migrate.ErrLockTimeout)
	assert.ErrorIs(t, err, advisory.ErrLockTimeout)
	require.NoError(t, stock.inner.Unlock())
	require.NoError(t, ours.m.Up())
	assert.Equal(t, map[int]int{1: 1}, f.counts(t))
}

// A wait that times out ends in the server: nothing is held or awaited
// afterwards, and the lock is never taken later (golang-migrate issue 269:
// the stock driver's wait goes on after Migrate's timer gave up).
func TestTimeoutLeavesNothingHeldAndNeverLocksLater(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{LockTimeout: 300 * time.Millisecond})
	holder := hold(t, ctx, f.check, r.d.Key())

	err := r.m.Up()
	require.ErrorIs(t, err, migrate.ErrLockTimeout)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "55P03", pgErr.Code)
	pgtest.AssertNoAdvisoryLocks(t, r.pool) // neither held nor awaited

	require.NoError(t, holder.Unlock(ctx))
	// Nobody took it after the holder let go: a try from elsewhere gets it.
	again := tryHold(t, ctx, f.check, r.d.Key())
	require.NoError(t, again.Unlock(ctx))
	pgtest.AssertNoAdvisoryLocks(t, r.pool)
	assert.Empty(t, f.counts(t))
	v, _, err := r.m.Version()
	assert.ErrorIs(t, err, migrate.ErrNilVersion, "version %d", v)
}

// Cancelling Wrap's context ends a wait at once, with nothing held.
func TestCancelEndsTheWait(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := f.replica(t, wctx, false, pgxlockmigrate.Config{LockTimeout: time.Minute})
	holder := hold(t, ctx, f.check, r.d.Key())
	defer func() { _ = holder.Unlock(ctx) }()

	done := make(chan error, 1)
	go func() { done <- r.m.Up() }()
	awaitLock(t, ctx, f.check, r.pool, false)
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-ctx.Done():
		t.Fatal("Up did not return after its context was cancelled")
	}
	require.NoError(t, holder.Unlock(ctx))
	again := tryHold(t, ctx, f.check, r.d.Key())
	require.NoError(t, again.Unlock(ctx))
	assert.Empty(t, f.counts(t))
}

// A lock lost during the migrations stops Migrate after the one that is
// running, calls OnLost once, and makes Up's error match ErrLockLost.
func TestLostLockStopsMigrate(t *testing.T) {
	ctx := testCtx(t)
	gate := pgtest.UniqueInt64(t)
	f := newFixture(t, 3, gate)
	lost := make(chan error, 4)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{OnLost: func(err error) { lost <- err }})

	// Migration 2 waits for the gate, a transaction lock held here.
	tx := f.holdGate(t, ctx)

	done := make(chan error, 1)
	go func() { done <- r.m.Up() }()
	awaitLock(t, ctx, f.check, r.pool, false) // migration 2 waits for the gate
	holderPID := lockPID(t, ctx, f.check, r.pool, r.d.Key())
	_, err := f.check.Exec(ctx, "SELECT pg_terminate_backend($1)", holderPID)
	require.NoError(t, err)
	select {
	case err := <-lost:
		assert.ErrorIs(t, err, advisory.ErrLockLost)
	case <-ctx.Done():
		t.Fatal("OnLost was not called")
	}
	require.NoError(t, tx.Commit(ctx)) // migration 2 goes on and ends
	select {
	case err := <-done:
		assert.ErrorIs(t, err, advisory.ErrLockLost)
	case <-ctx.Done():
		t.Fatal("Up did not return")
	}
	assert.Equal(t, map[int]int{1: 1, 2: 1}, f.counts(t), "migration 3 must not run after the loss")
	assert.Empty(t, lost, "OnLost called more than once")
}

// Lock and Unlock keep golang-migrate's driver contract.
func TestLockUnlockContract(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{})
	assert.ErrorIs(t, r.d.Unlock(), database.ErrNotLocked)
	require.NoError(t, r.d.Lock())
	assert.ErrorIs(t, r.d.Lock(), database.ErrLocked)
	require.NoError(t, r.d.Unlock())
	require.NoError(t, r.d.Lock())
	require.NoError(t, r.d.Close()) // releases the lock
	pgtest.AssertNoAdvisoryLocks(t, r.pool)
}

func hold(t *testing.T, ctx context.Context, pool *pgxpool.Pool, k keys.Key) *advisory.Lock {
	t.Helper()
	l, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Unlock(context.Background()) })
	return h
}

func tryHold(t *testing.T, ctx context.Context, pool *pgxpool.Pool, k keys.Key) *advisory.Lock {
	t.Helper()
	l, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	h, err := l.TryLock(ctx, k, nil)
	require.NoError(t, err, "the key is held by someone else")
	return h
}

// awaitLock waits until a backend of pool holds (granted) or awaits (not
// granted) some advisory lock.
func awaitLock(t *testing.T, ctx context.Context, check, pool *pgxpool.Pool, granted bool) {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	for {
		locks, err := pgtest.AdvisoryLocks(ctx, check, app)
		require.NoError(t, err)
		for _, l := range locks {
			if l.Granted == granted {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no backend of %s came to %s an advisory lock", app, map[bool]string{true: "hold", false: "await"}[granted])
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lockPID returns the backend of pool that holds k.
func lockPID(t *testing.T, ctx context.Context, check, pool *pgxpool.Pool, k keys.Key) int32 {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	locks, err := pgtest.AdvisoryLocks(ctx, check, app)
	require.NoError(t, err)
	want := bigint(k)
	for _, l := range locks {
		if l.Granted && l.Key() == want {
			return l.PID
		}
	}
	t.Fatalf("no backend of %s holds %s: %v", app, want, locks)
	return 0
}

// Found by review: without Attach, Migrate's own timer (here 2 s) gave up
// before the driver's wait (10 s), which then took the lock and kept it.
// Lock now refuses without an attached Migrate.
func TestLockWithoutAttachIsRefused(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, true, pgxlockmigrate.Config{})
	d, err := pgxlockmigrate.Wrap(ctx, r.inner, r.pool, pgxlockmigrate.Config{SchemaName: f.schema})
	require.NoError(t, err)
	name, src := f.source(t)
	m, err := migrate.NewWithInstance(name, src, "pgx5", d)
	require.NoError(t, err)
	err = m.Up()
	assert.ErrorIs(t, err, pgxlockmigrate.ErrNotAttached)
	assert.ErrorIs(t, err, advisory.ErrInvalid)
	pgtest.AssertNoAdvisoryLocks(t, r.pool)
	assert.Empty(t, f.counts(t))
}

// Found by review: Migrate's LockTimeout lowered after Attach (to 2 s,
// under the driver's 10 s) let Migrate give up first while the driver's
// wait went on. The wait is bounded by Migrate's timer less a margin now:
// the server ends it first, and nothing is held or awaited after Up.
func TestLoweredMigrateTimerBoundsTheWait(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{})
	r.m.LockTimeout = 2 * time.Second
	holder := hold(t, ctx, f.check, r.d.Key())
	err := r.m.Up()
	require.ErrorIs(t, err, advisory.ErrLockTimeout, "the server's lock_timeout ended the wait, not Migrate's timer")
	pgtest.AssertNoAdvisoryLocks(t, r.pool)
	require.NoError(t, holder.Unlock(ctx))
	again := tryHold(t, ctx, f.check, r.d.Key())
	require.NoError(t, again.Unlock(ctx))
}

// Found by review: an OnLost that unlocks the Driver deadlocked Up.
func TestOnLostMayUnlock(t *testing.T) {
	ctx := testCtx(t)
	gate := pgtest.UniqueInt64(t)
	f := newFixture(t, 3, gate)
	var d *pgxlockmigrate.Driver
	unlocked := make(chan error, 1)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{OnLost: func(error) { unlocked <- d.Unlock() }})
	d = r.d
	tx := f.holdGate(t, ctx)
	done := make(chan error, 1)
	go func() { done <- r.m.Up() }()
	awaitLock(t, ctx, f.check, r.pool, false)
	_, err := f.check.Exec(ctx, "SELECT pg_terminate_backend($1)", lockPID(t, ctx, f.check, r.pool, r.d.Key()))
	require.NoError(t, err)
	select {
	case <-unlocked:
	case <-ctx.Done():
		t.Fatal("OnLost's Unlock did not return")
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-done:
		assert.Error(t, err)
	case <-ctx.Done():
		t.Fatal("Up did not return")
	}
}

// Found by review: Migrate.Close during Up let the lock go while the
// migration still ran, so another replica could start migrating. Close
// waits for the migration in flight now.
func TestCloseDuringUpKeepsTheLockUntilTheMigrationEnds(t *testing.T) {
	ctx := testCtx(t)
	gate := pgtest.UniqueInt64(t)
	f := newFixture(t, 2, gate)
	r := f.replica(t, ctx, false, pgxlockmigrate.Config{})
	tx := f.holdGate(t, ctx)
	done := make(chan error, 1)
	go func() { done <- r.m.Up() }()
	awaitLock(t, ctx, f.check, r.pool, false) // migration 2 waits for the gate
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = r.m.Close()
	}()
	// While migration 2 runs, nobody else gets the key, whatever Close does.
	l, err := advisory.New(f.check, advisory.Config{})
	require.NoError(t, err)
	for range 20 {
		_, err := l.TryLock(ctx, r.d.Key(), nil)
		require.ErrorIs(t, err, advisory.ErrNotAcquired, "the key was let go while its migration ran")
		select {
		case <-closed:
			t.Fatal("Close returned while the migration ran")
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.NoError(t, tx.Commit(ctx))
	<-closed
	<-done
	assert.Equal(t, map[int]int{1: 1, 2: 1}, f.counts(t))
}

// Found by review: a Migrate.LockTimeout below 2 ms (0, 300µs) left a
// bound of less than the 1 ms floor of lock_timeout, so the wait outlived
// Migrate's timer and the lock was taken after Up had returned. Lock
// refuses such a timer now, with nothing held.
func TestTooShortMigrateTimerIsRefused(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 1, 0)
	for _, lt := range []time.Duration{0, 300 * time.Microsecond, time.Millisecond} {
		r := f.replica(t, ctx, false, pgxlockmigrate.Config{})
		r.m.LockTimeout = lt
		err := r.m.Up()
		require.Error(t, err, "LockTimeout %v", lt)
		require.NotErrorIs(t, err, migrate.ErrNoChange)
		pgtest.AssertNoAdvisoryLocks(t, r.pool)
		again := tryHold(t, ctx, f.check, r.d.Key())
		require.NoError(t, again.Unlock(ctx))
	}
	assert.Empty(t, f.counts(t))
}

// Wrap's doc: the default key's read of the database and schema names
// waits for a free connection of pool as long as ctx allows (review 31k:
// on a pool whose only connection was taken, with a context without a
// deadline, it never returned); with the names given, nothing is read.
func TestWrapReadsTheNamesWithinCtx(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	f := newFixture(t, 1, 0)
	r := f.replica(t, ctx, true, pgxlockmigrate.Config{})
	held, err := pool.Acquire(ctx) // what the inner driver would keep
	require.NoError(t, err)
	defer held.Release()
	bounded, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = pgxlockmigrate.Wrap(bounded, r.inner, pool, pgxlockmigrate.Config{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = pgxlockmigrate.Wrap(bounded, r.inner, pool, pgxlockmigrate.Config{DatabaseName: "db", SchemaName: "public"})
	require.NoError(t, err)
}
