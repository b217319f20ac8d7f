package pgtest

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
)

// recordingTB stands in for a test whose failures and cleanups we want to inspect.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recordingTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *recordingTB) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// run calls f in its own goroutine, as the testing package does, so Fatal can Goexit.
func (r *recordingTB) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func (r *recordingTB) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.run(r.cleanups[i])
	}
	r.cleanups = nil
}

func (r *recordingTB) errors() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errs, "\n")
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPoolConnectsWithUniqueApplicationName(t *testing.T) {
	pool := Pool(t)
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	var got string
	require.NoError(t, pool.QueryRow(ctxT(t), "SELECT current_setting('application_name')").Scan(&got))
	assert.Equal(t, app, got)
	assert.True(t, strings.HasPrefix(app, "pgxlock-test-TestPoolConnectsWithUniqueApplicationName-"), app)
	assert.EqualValues(t, 4, pool.Config().MaxConns)
	AssertNoAdvisoryLocks(t, pool)
}

func TestAppName(t *testing.T) {
	long := strings.Repeat("very long name with spaces/and ünicode ", 5)
	t.Run(long, func(t *testing.T) {
		a, b := appName(t), appName(t)
		assert.NotEqual(t, a, b)
		for _, name := range []string{a, b} {
			assert.LessOrEqual(t, len(name), 63, name)
			assert.True(t, strings.HasPrefix(name, "pgxlock-test-TestAppName_very_long_name_with_spaces"), name)
			for _, r := range name {
				assert.True(t, r < 128 && r != ' ' && r != '/', "bad rune %q in %s", r, name)
			}
		}
		// The server keeps it whole.
		cfg := Config(t)
		cfg.ConnConfig.RuntimeParams["application_name"] = a
		pool := NewPool(t, cfg)
		var got string
		require.NoError(t, pool.QueryRow(ctxT(t), "SELECT current_setting('application_name')").Scan(&got))
		assert.Equal(t, a, got)
	})
}

func TestNewPoolFillsMissingApplicationName(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(DSN(t))
	require.NoError(t, err)
	delete(cfg.ConnConfig.RuntimeParams, "application_name")
	pool := NewPool(t, cfg)
	assert.True(t, strings.HasPrefix(pool.Config().ConnConfig.RuntimeParams["application_name"], appNamePrefix))
}

func TestUniqueKeys(t *testing.T) {
	seen64 := map[int64]bool{}
	seen32 := map[int32]bool{}
	for range 1000 {
		k := UniqueInt64(t)
		assert.False(t, seen64[k], "duplicate int64 key %d", k)
		seen64[k] = true
		seen32[UniqueInt32(t)] = true
	}
	assert.Greater(t, len(seen32), 990) // int32 collisions are possible, but rare
}

func TestSchemaCreatedAndDropped(t *testing.T) {
	pool := Pool(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		name = Schema(t, pool)
		assert.Regexp(t, `^t_[0-9a-f]{12}$`, name)
		_, err := pool.Exec(ctxT(t), "CREATE TABLE "+pgx.Identifier{name, "leases"}.Sanitize()+" (id int)")
		require.NoError(t, err)
	})
	var exists bool
	require.NoError(t, pool.QueryRow(ctxT(t),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&exists))
	assert.False(t, exists, "schema %s not dropped at cleanup", name)
}

// AdvisoryLocks decodes both key spaces, negative keys included, and shows waiters.
func TestAdvisoryLocksDecodes(t *testing.T) {
	ctx := ctxT(t)
	pool := Pool(t)
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	key := -UniqueInt64(t)
	if key > 0 {
		key = -key
	}
	a, b := UniqueInt32(t), int32(-7)
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1), pg_advisory_lock_shared($2, $3)", key, a, b)
	require.NoError(t, err)

	// A second connection waits for the bigint key.
	waiter, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer waiter.Release()
	waitDone := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
		waitDone <- err
	}()

	var locks []HeldLock
	require.Eventually(t, func() bool {
		locks, err = AdvisoryLocks(ctx, pool, app)
		require.NoError(t, err)
		return len(locks) == 3
	}, 10*time.Second, 10*time.Millisecond)

	var got []string
	for _, l := range locks {
		got = append(got, fmt.Sprintf("%s %s %v", l.Key(), l.Mode, l.Granted))
		assert.Equal(t, app, l.ApplicationName)
		assert.NotZero(t, l.PID)
		assert.NotEmpty(t, l.Database)
	}
	assert.ElementsMatch(t, []string{
		fmt.Sprintf("bigint %d ExclusiveLock true", key),
		fmt.Sprintf("int4 pair (%d, %d) ShareLock true", a, b),
		fmt.Sprintf("bigint %d ExclusiveLock false", key),
	}, got)
	assert.Contains(t, locks[0].String(), "key ")

	// "" lists every backend's locks, ours among them.
	all, err := AdvisoryLocks(ctx, pool, "")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(all), 3)

	var ok bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1) AND pg_advisory_unlock_shared($2, $3)", key, a, b).Scan(&ok))
	require.True(t, ok)
	require.NoError(t, <-waitDone)
	require.NoError(t, waiter.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok))
	require.True(t, ok)
	AssertNoAdvisoryLocks(t, pool)
}

func TestHeldLockKey(t *testing.T) {
	for _, tc := range []struct {
		l    HeldLock
		want string
	}{
		{HeldLock{ClassID: 0xFFFFFFFF, ObjID: 0xFFFFFFFF, ObjSubID: 1}, "bigint -1"},
		{HeldLock{ClassID: 0x80000000, ObjID: 0, ObjSubID: 1}, "bigint -9223372036854775808"},
		{HeldLock{ClassID: 0, ObjID: 42, ObjSubID: 1}, "bigint 42"},
		{HeldLock{ClassID: 1, ObjID: 2, ObjSubID: 1}, "bigint 4294967298"},
		{HeldLock{ClassID: 0xFFFFFFFB, ObjID: 7, ObjSubID: 2}, "int4 pair (-5, 7)"},
		{HeldLock{ClassID: 1, ObjID: 2, ObjSubID: 9}, "unknown key space (classid 1, objid 2, objsubid 9)"},
	} {
		assert.Equal(t, tc.want, tc.l.Key())
	}
}

// A lock left on a pooled connection fails the test at cleanup, with the key decoded.
func TestCleanupReportsLeakedLock(t *testing.T) {
	defer func(d time.Duration) { leakSettle = d }(leakSettle)
	leakSettle = 100 * time.Millisecond

	rec := &recordingTB{TB: t}
	var pool *pgxpool.Pool
	rec.run(func() { pool = Pool(rec) })
	require.NotNil(t, pool, rec.errors())
	key := UniqueInt64(t)
	_, err := pool.Exec(ctxT(t), "SELECT pg_advisory_lock($1)", key) // released to the pool still locked
	require.NoError(t, err)

	rec.run(func() { AssertNoAdvisoryLocks(rec, pool) })
	require.Contains(t, rec.errors(), fmt.Sprintf("key bigint %d", key))

	rec.errs = nil
	rec.runCleanups()
	msg := rec.errors()
	assert.Contains(t, msg, "still hold or await advisory locks")
	assert.Contains(t, msg, fmt.Sprintf("key bigint %d", key))
	assert.Contains(t, msg, pool.Config().ConnConfig.RuntimeParams["application_name"])
	t.Log(msg)
}

// A holder whose connection was just closed releases its lock a moment later; the cleanup
// check waits for that instead of reporting a false leak.
func TestCleanupToleratesJustClosedHolder(t *testing.T) {
	rec := &recordingTB{TB: t}
	var pool *pgxpool.Pool
	rec.run(func() { pool = Pool(rec) })
	require.NotNil(t, pool, rec.errors())
	ctx := ctxT(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", UniqueInt64(t))
	require.NoError(t, err)
	pgc := conn.Hijack()
	require.NoError(t, pgc.Close(ctx)) // the backend exits asynchronously

	rec.runCleanups()
	assert.Empty(t, rec.errors())
}

// The throwaway path through pglaunch: connect, query, restart, query, stop, nothing left.
func TestPrivateCluster(t *testing.T) {
	c := Cluster(t)
	cfg, err := pgxpool.ParseConfig(c.DSN())
	require.NoError(t, err)
	pool := NewPool(t, cfg)
	ctx := ctxT(t)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 41 + 1").Scan(&n))
	assert.Equal(t, 42, n)

	require.NoError(t, c.Restart(ctx))
	// The pool's old connections died with the server; pgxpool replaces them.
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, "SELECT 43").Scan(&n) == nil
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 43, n)

	pool.Close() // before Stop: the end-of-test check would only log a refused connection
	require.NoError(t, c.Stop(ctx))
	assert.NoDirExists(t, filepath.Dir(c.DataDir()))
	assert.NoError(t, c.Stop(ctx), "Stop is idempotent")
	_, err = pgx.Connect(ctx, c.DSN())
	assert.Error(t, err)
}

// Replicated gives a primary and a streaming standby; a pool on the multi-host DSN
// writes to the primary, and after the primary stops and the standby is promoted, to the
// standby, which holds what the primary wrote (synchronous replication).
func TestReplicated(t *testing.T) {
	primary, standby := Replicated(t, pglaunch.StandbyOptions{Synchronous: true})
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pglaunch.MultiHostDSN(primary, standby))
	require.NoError(t, err)
	pool := NewPool(t, cfg)
	_, err = pool.Exec(ctx, "CREATE TABLE r (id int); INSERT INTO r VALUES (1)")
	require.NoError(t, err)

	require.NoError(t, primary.Stop(ctx))
	require.NoError(t, standby.Promote(ctx))
	// The pool's connections died with the primary; new ones reach the standby.
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, "INSERT INTO r VALUES (2)")
		return err == nil
	}, 30*time.Second, 20*time.Millisecond)
	var dir string
	require.NoError(t, pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir))
	assert.Equal(t, standby.DataDir(), dir)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM r").Scan(&n))
	assert.Equal(t, 2, n)
}

// DSN insists on Main, which is what stops a throwaway server.
func TestDSNWithoutMainFails(t *testing.T) {
	harness.mainRunning.Store(false)
	defer harness.mainRunning.Store(true)
	rec := &recordingTB{TB: t}
	rec.run(func() { DSN(rec) })
	assert.Contains(t, rec.errors(), "pgtest.Main")
}

func TestParallelPools(t *testing.T) {
	for i := range 4 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			pool := Pool(t)
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			key := UniqueInt64(t)
			var ok bool
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok))
			require.True(t, ok)
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok))
			require.True(t, ok)
		})
	}
}
