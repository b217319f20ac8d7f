package lease_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The token format's arithmetic: timeline tl's floor is (tl-1) << 40;
// tokens stay below 2^53 (exact as a float64) through timeline 8192; the
// last timeline that fits int64 leaves 2^40 tokens below MaxInt64, and the
// next one fails with 22003 instead of wrapping to a negative token.
func TestTokenFloorLimits(t *testing.T) {
	pool := pgtest.Pool(t)
	floor := func(tl int64) (int64, error) {
		var v int64
		err := pool.QueryRow(testCtx(t), "SELECT "+lease.TokenFloorSQLForTest("$1::bigint"), tl).Scan(&v)
		return v, err
	}
	for tl, want := range map[int64]int64{1: 0, 2: 1 << 40, 3: 2 << 40, 8193: 1 << 53, 1 << 23: math.MaxInt64 - (1 << 40) + 1} {
		got, err := floor(tl)
		require.NoError(t, err, "timeline %d", tl)
		assert.Equal(t, want, got, "timeline %d", tl)
		assert.Equal(t, tl, got>>lease.TimelineShift+1, "the timeline reads back from the token's high bits")
	}
	_, err := floor(1<<23 + 1)
	assertPgCode(t, err, "22003")
	_, err = floor(math.MaxUint32) // the largest timeline PostgreSQL can number
	assertPgCode(t, err, "22003")
}

// Existing counters need no migration: the next token is the counter plus
// one, raised to the server's timeline floor, which is 0 on timeline 1 (a
// server never promoted, such as a fresh private cluster), so tokens there
// are the plain counter as before; a counter already above the floor keeps
// counting by one.
func TestTokensContinueExistingCounters(t *testing.T) {
	t.Run("test database", func(t *testing.T) { testTokensContinue(t, pgtest.Pool(t)) })
	t.Run("private cluster on timeline 1", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(pgtest.Cluster(t).DSN())
		require.NoError(t, err)
		pool := pgtest.NewPool(t, cfg)
		require.Equal(t, int64(1), queryOne[int64](t, pool, "SELECT "+lease.TimelineSQLForTest))
		testTokensContinue(t, pool)
	})
}

func testTokensContinue(t *testing.T, p1 *pgxpool.Pool) {
	schema := pgtest.Schema(t, p1)
	ctx := testCtx(t)
	tl := queryOne[int64](t, p1, "SELECT "+lease.TimelineSQLForTest)
	floor := (tl - 1) << lease.TimelineShift
	next := func(counter int64) int64 { return max(counter+1, floor) }
	if tl == 1 {
		require.Equal(t, int64(42), next(41), "on timeline 1 the token is the plain counter")
	}

	col := usersTable(t, p1, schema, time.Minute, 1, 2)
	users := pgx.Identifier{schema, "users"}.Sanitize()
	mustExec(t, p1, "UPDATE "+users+" SET identity_action_fence = 41 WHERE id = 1")
	mustExec(t, p1, "UPDATE "+users+" SET identity_action_fence = $1 WHERE id = 2", int64(1)<<62+5)
	for id, want := range map[int64][]int64{1: {next(41), next(next(41))}, 2: {1<<62 + 6, 1<<62 + 7}} {
		for _, w := range want {
			l, err := col.TryAcquire(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, w, l.Token(), "row %d", id)
			require.NoError(t, l.Release(ctx))
		}
	}

	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	resources := pgx.Identifier{schema, "pgxlock_leases_resources"}.Sanitize()
	mustExec(t, p1, "INSERT INTO "+resources+" (resource, fence) VALUES ('old', 41)")
	for _, w := range []int64{next(41), next(next(41))} {
		l, err := m.TryAcquire(ctx, "old", nil)
		require.NoError(t, err)
		assert.Equal(t, w, l.Token())
		require.NoError(t, l.Release(ctx))
	}
	l, err := m.TryAcquire(ctx, "new", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	assert.Equal(t, next(0), l.Token(), "a new resource starts at 1 on timeline 1, at the floor on others")
	require.NoError(t, l.Release(ctx))
}

// The timeline is read without privileges: an ordinary login role (no
// superuser, no pg_monitor) acquires both forms of lease.
func TestTokensNeedNoPrivilege(t *testing.T) {
	admin, _, schema := twoPools(t)
	ctx := testCtx(t)
	usersTable(t, admin, schema, time.Minute, 1)
	newManager(t, admin, schema, lease.ManagerConfig{TTL: time.Minute})

	role := fmt.Sprintf("pgxlock_plain_%d", pgtest.UniqueInt64(t)&0xffffffff)
	qrole := pgx.Identifier{role}.Sanitize()
	mustExec(t, admin, "CREATE ROLE "+qrole+" LOGIN NOSUPERUSER NOINHERIT")
	t.Cleanup(func() {
		mustExec(t, admin, "DROP OWNED BY "+qrole)
		mustExec(t, admin, "DROP ROLE "+qrole)
	})
	qschema := pgx.Identifier{schema}.Sanitize()
	mustExec(t, admin, "GRANT USAGE ON SCHEMA "+qschema+" TO "+qrole)
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+qschema+" TO "+qrole)

	cfg := pgtest.Config(t)
	cfg.ConnConfig.User = role
	plain := pgtest.NewPool(t, cfg)
	require.False(t, queryOne[bool](t, plain, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))

	plainCol, err := lease.NewColumn(plain, lease.ColumnConfig{
		Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: time.Minute,
	})
	require.NoError(t, err)
	first := max(1, (queryOne[int64](t, plain, "SELECT "+lease.TimelineSQLForTest)-1)<<lease.TimelineShift)
	cl, err := plainCol.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, first, cl.Token())
	require.NoError(t, cl.Release(ctx))

	pm, err := lease.NewManager(plain, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	l, err := pm.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	assert.Equal(t, first, l.Token())
	require.NoError(t, l.Release(ctx))
}
