package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Fencing tokens across a standby promotion (issue 14 part 3). Each test runs
// a private primary with a streaming standby (pgtest.Replicated): tokens are
// taken on the primary, some of them while replication is paused so that the
// standby never sees them, then the old primary is stopped and the standby
// promoted, and tokens are taken again through a multi-host pool.

const firstTimeline2Token = int64(1) << lease.TimelineShift

// failoverPool is a pool on dsn (a private cluster, or a multi-host DSN).
func failoverPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	return pgtest.NewPool(t, cfg)
}

// awaitReplayed waits until the standby's answer to sql (one bigint) is want:
// the standby has replayed what the primary committed so far.
func awaitReplayed(t *testing.T, standby *pgxpool.Pool, sql string, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got int64
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return standby.QueryRow(ctx, sql).Scan(&got) == nil && got == want
	}, 45*time.Second, 20*time.Millisecond, "the standby replays %s = %d", sql, want)
}

// failover stops the old primary, promotes the standby, and drops the
// multi-host pool's connections to the old primary, so that the next
// acquisition connects to the new one.
func failover(t *testing.T, primary, standby *pglaunch.Cluster, pools ...*pgxpool.Pool) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, primary.Stop(ctx))
	require.NoError(t, standby.Promote(ctx))
	for _, p := range pools {
		p.Reset()
	}
}

// fencedAccounts creates the fenced store: one row, id 1.
func fencedAccounts(t *testing.T, pool *pgxpool.Pool) *lease.Fence {
	t.Helper()
	mustExec(t, pool, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO accounts (id) VALUES (1)")
	f, err := lease.NewFence(lease.FenceConfig{Table: "accounts"})
	require.NoError(t, err)
	return f
}

// Manager leases, exclusive and shared, with asynchronous replication: the
// last two tokens the old primary issued are lost in the failover, and the
// new primary's first tokens are still greater than both.
func TestFailoverTokensManagerAsync(t *testing.T) {
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{Synchronous: false})
	ctx := testCtx(t)
	pool := failoverPool(t, pglaunch.MultiHostDSN(primary, standby))
	onStandby := failoverPool(t, standby.DSN())
	m := newManager(t, pool, "", lease.ManagerConfig{TTL: time.Minute})
	f := fencedAccounts(t, pool)
	shared := &lease.AcquireOptions{Mode: lease.Shared}

	var old []int64 // every token the old primary issued
	take := func(opts *lease.AcquireOptions) *lease.Lease {
		l, err := m.TryAcquire(ctx, "r", opts)
		require.NoError(t, err)
		old = append(old, l.Token())
		return l
	}
	for _, opts := range []*lease.AcquireOptions{nil, shared, nil} {
		require.NoError(t, take(opts).Release(ctx))
	}
	const counter = "SELECT fence FROM pgxlock_leases_resources WHERE resource = 'r'"
	awaitReplayed(t, onStandby, counter, 3)

	require.NoError(t, standby.PauseReplication(ctx))
	require.NoError(t, take(shared).Release(ctx))
	holder := take(nil) // the old holder: its lease and token are not replicated
	require.NoError(t, f.Update(ctx, pool, 1, holder.Token(), map[string]any{"balance": 1}))
	assert.Equal(t, []int64{1, 2, 3, 4, 5}, old, "timeline 1: the plain counter")

	failover(t, primary, standby, pool, onStandby)
	require.Equal(t, int64(3), queryOne[int64](t, pool, counter), "the new primary lost the last two acquisitions")
	require.Equal(t, int64(2), queryOne[int64](t, pool, "SELECT "+lease.TimelineSQLForTest), "the new primary reads timeline 2 at once")

	reader, err := m.TryAcquire(ctx, "r", shared)
	require.NoError(t, err, "the old holder's lease was lost with its row")
	assert.Equal(t, firstTimeline2Token, reader.Token(), "the first token on timeline 2 is its floor")
	require.NoError(t, reader.Release(ctx))
	writer, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	assert.Equal(t, firstTimeline2Token+1, writer.Token())
	for _, tok := range old {
		assert.Greater(t, reader.Token(), tok, "every new token exceeds every token of the old primary")
	}
	assert.Equal(t, int64(2), writer.Token()>>lease.TimelineShift+1, "the token's high bits read back the timeline")

	require.NoError(t, f.Update(ctx, pool, 1, writer.Token(), map[string]any{"balance": 2}))
	require.ErrorIs(t, f.Update(ctx, pool, 1, holder.Token(), map[string]any{"balance": 666}), lease.ErrLeaseLost,
		"the old holder's newest token is stale on the new primary")
	assert.Equal(t, 2, queryOne[int](t, pool, "SELECT balance FROM accounts"))
	require.ErrorIs(t, holder.Renew(ctx), lease.ErrLeaseLost, "the old holder learns at its next renewal")
	require.NoError(t, writer.Release(ctx))
}

// Column leases with asynchronous replication: as above, for the fence column.
func TestFailoverTokensColumnAsync(t *testing.T) {
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{Synchronous: false})
	ctx := testCtx(t)
	pool := failoverPool(t, pglaunch.MultiHostDSN(primary, standby))
	onStandby := failoverPool(t, standby.DSN())
	col := usersTable(t, pool, "public", time.Minute, 1)
	f := fencedAccounts(t, pool)

	var old []int64
	take := func() *lease.ColumnLease {
		l, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		old = append(old, l.Token())
		return l
	}
	for range 3 {
		require.NoError(t, take().Release(ctx))
	}
	const counter = "SELECT identity_action_fence FROM users WHERE id = 1"
	awaitReplayed(t, onStandby, counter, 3)

	require.NoError(t, standby.PauseReplication(ctx))
	require.NoError(t, take().Release(ctx))
	holder := take()
	require.NoError(t, f.Update(ctx, pool, 1, holder.Token(), map[string]any{"balance": 1}))
	assert.Equal(t, []int64{1, 2, 3, 4, 5}, old, "timeline 1: the plain counter")

	failover(t, primary, standby, pool, onStandby)
	require.Equal(t, int64(3), queryOne[int64](t, pool, counter), "the new primary lost the last two acquisitions")

	next, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err, "the old holder's claim was lost with the row version")
	assert.Equal(t, firstTimeline2Token, next.Token(), "the first token on timeline 2 is its floor")
	for _, tok := range old {
		assert.Greater(t, next.Token(), tok, "every new token exceeds every token of the old primary")
	}
	require.NoError(t, f.Update(ctx, pool, 1, next.Token(), map[string]any{"balance": 2}))
	require.ErrorIs(t, f.Update(ctx, pool, 1, holder.Token(), map[string]any{"balance": 666}), lease.ErrLeaseLost,
		"the old holder's newest token is stale on the new primary")
	assert.Equal(t, 2, queryOne[int](t, pool, "SELECT balance FROM accounts"))
	require.ErrorIs(t, holder.Renew(ctx), lease.ErrLeaseLost, "the old holder learns at its next renewal")
	require.NoError(t, next.Release(ctx))
	again, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, firstTimeline2Token+1, again.Token(), "and counts on by one")
	require.NoError(t, again.Release(ctx))
}

// Synchronous replication: nothing acknowledged is lost. The holder's lease
// is still there on the new primary (it renews, others are refused), and the
// next tokens jump to timeline 2's floor, above the old ones.
func TestFailoverTokensSync(t *testing.T) {
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{Synchronous: true})
	ctx := testCtx(t)
	pool := failoverPool(t, pglaunch.MultiHostDSN(primary, standby))
	m := newManager(t, pool, "", lease.ManagerConfig{TTL: time.Minute})
	col := usersTable(t, pool, "public", time.Minute, 1)

	for range 2 {
		l, err := m.TryAcquire(ctx, "r", nil)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		cl, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		require.NoError(t, cl.Release(ctx))
	}
	held, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	heldRow, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, int64(3), held.Token())
	assert.Equal(t, int64(3), heldRow.Token())

	failover(t, primary, standby, pool)

	require.NoError(t, held.Renew(ctx), "the lease survived the failover")
	require.NoError(t, heldRow.Renew(ctx), "the column lease survived the failover")
	_, err = m.TryAcquire(ctx, "r", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "and still excludes")
	_, err = col.TryAcquire(ctx, int64(1))
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	require.NoError(t, held.Release(ctx))
	require.NoError(t, heldRow.Release(ctx))

	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	assert.Equal(t, firstTimeline2Token, l.Token())
	require.NoError(t, l.Release(ctx))
	cl, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, firstTimeline2Token, cl.Token())
	require.NoError(t, cl.Release(ctx))
}

// An old primary that is cut off but keeps running keeps issuing timeline-1
// tokens after the promotion; they are all below the new primary's, so a
// fenced store on the new primary rejects them once the new holder wrote. A
// fenced store on the old primary itself accepts them: it never sees the new
// tokens (what the package documentation says is not guaranteed). A standby
// in recovery issues no token at all: its BEGIN READ WRITE is refused with
// 0A000, and the error wraps the server's. A fence column declared integer
// fails the first acquisition after the promotion with 22003.
func TestFailoverTokensOldPrimaryStillRunning(t *testing.T) {
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{Synchronous: false})
	ctx := testCtx(t)
	oldPool := failoverPool(t, primary.DSN())
	newPool := failoverPool(t, standby.DSN())
	mOld := newManager(t, oldPool, "", lease.ManagerConfig{TTL: time.Minute})
	fOld := fencedAccounts(t, oldPool)
	// A fence column declared integer instead of bigint.
	mustExec(t, oldPool, "CREATE TABLE narrow (id int PRIMARY KEY, locked_at timestamptz, locked_by text, lock_fence integer NOT NULL DEFAULT 0)")
	mustExec(t, oldPool, "INSERT INTO narrow (id) VALUES (1)")
	colOld := usersTable(t, oldPool, "public", time.Minute, 1)
	awaitReplayed(t, newPool, "SELECT count(*) FROM users", 1)

	mNew, err := lease.NewManager(newPool, lease.ManagerConfig{TTL: time.Minute})
	require.NoError(t, err)
	_, err = mNew.TryAcquire(ctx, "r", nil)
	assertPgCode(t, err, "0A000")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `lease: try acquire "r"`)
	assert.Contains(t, err.Error(), "cannot set transaction read-write mode during recovery")
	t.Logf("on the standby: %v", err)

	require.NoError(t, standby.PauseReplication(ctx))
	require.NoError(t, standby.Promote(ctx))

	colNew, err := lease.NewColumn(newPool, lease.ColumnConfig{Schema: "public", Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: time.Minute})
	require.NoError(t, err)
	fNew, err := lease.NewFence(lease.FenceConfig{Table: "accounts"})
	require.NoError(t, err)

	newer, err := mNew.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	newerRow, err := colNew.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, firstTimeline2Token, newer.Token())
	assert.Equal(t, firstTimeline2Token, newerRow.Token())
	narrow, err := lease.NewColumn(newPool, lease.ColumnConfig{Table: "narrow", TTL: time.Minute})
	require.NoError(t, err)
	_, err = narrow.TryAcquire(ctx, 1)
	assertPgCode(t, err, "22003") // integer out of range: the fence column must be bigint
	t.Logf("integer fence column after a promotion: %v", err)
	require.NoError(t, fNew.Update(ctx, newPool, 1, newer.Token(), map[string]any{"balance": 2}))

	// The split brain: the old primary grants the same resources again.
	older, err := mOld.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	olderRow, err := colOld.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Less(t, older.Token(), newer.Token())
	assert.Less(t, olderRow.Token(), newerRow.Token())
	require.ErrorIs(t, fNew.Update(ctx, newPool, 1, older.Token(), map[string]any{"balance": 666}), lease.ErrLeaseLost,
		"rejected by a store on the new primary")
	require.NoError(t, fOld.Update(ctx, oldPool, 1, older.Token(), map[string]any{"balance": 666}),
		"accepted by a store on the old primary, which never saw the new token")
	for _, l := range []interface{ Release(context.Context) error }{newer, newerRow, older, olderRow} {
		require.NoError(t, l.Release(ctx))
	}
}
