package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Issue 21 item 7: Do with a failing callback returned an errors.Join value
// holding only the callback's error, so errors.As(*lease.Error) was false,
// against "Every error is an [*Error]". Every form's error is one, names
// the call, wraps the callback's error for errors.Is and keeps its text.
func TestDoErrorIsAnError(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	col := usersTable(t, pool, schema, time.Minute, 1)
	mine := errors.New("lease: my own words")
	forms := map[string]func() error{
		"do": func() error {
			return m.Do(ctx, "r", nil, func(context.Context, *lease.Lease) error { return mine })
		},
		"try do": func() error {
			return m.TryDo(ctx, "r", nil, func(context.Context, *lease.Lease) error { return mine })
		},
		"column try do": func() error {
			return col.TryDo(ctx, int64(1), nil, func(context.Context, *lease.ColumnLease) error { return mine })
		},
	}
	for name, do := range forms {
		err := do()
		var le *lease.Error
		require.True(t, errors.As(err, &le), "%s: %v", name, err)
		assert.Contains(t, []string{"do", "try do"}, le.Op, name)
		assert.NotEmpty(t, le.Resource, name)
		assert.ErrorIs(t, err, mine, name)
		assert.Contains(t, err.Error(), mine.Error(), "%s: the callback's text is kept", name)
	}
	require.NoError(t, m.Do(ctx, "r", nil, func(context.Context, *lease.Lease) error { return nil }))
}

// Issue 21 item 7: with Schema empty, two tables of one name reached through
// different search_paths share the default NOTIFY channel (the doc said two
// tables never share one; it now says when they do). Sharing costs a
// wake-up, not exclusion: a release in one table does not let a waiter of
// the other in. With Schema set, the channels differ.
func TestDefaultChannelAndSearchPath(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	sa, sb := pgtest.Schema(t, admin), pgtest.Schema(t, admin)
	poolIn := func(schema string) *lease.Manager {
		cfg := pgtest.Config(t)
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		m, err := lease.NewManager(pgtest.NewPool(t, cfg), lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx))
		return m
	}
	ma, mb := poolIn(sa), poolIn(sb)
	assert.Equal(t, ma.Channel(), mb.Channel(), "unresolved names: one channel")
	qa, err := lease.NewManager(admin, lease.ManagerConfig{Schema: sa, TTL: time.Minute})
	require.NoError(t, err)
	qb, err := lease.NewManager(admin, lease.ManagerConfig{Schema: sb, TTL: time.Minute})
	require.NoError(t, err)
	assert.NotEqual(t, qa.Channel(), qb.Channel())
	assert.NotEqual(t, qa.Channel(), ma.Channel())

	heldA, err := ma.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	heldB, err := mb.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		l, err := ma.Acquire(ctx, "r", nil)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	require.Eventually(t, func() bool {
		return queryOne[int](t, admin, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND query LIKE '%'||$1||'%'`, ma.Channel()) > 0
	}, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, heldB.Release(ctx), "wakes the waiter of the other table")
	// The woken waiter tries again, and its own resource is still held.
	hs, err := ma.List(ctx, &lease.ListOptions{Resource: "r"})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, heldA.Token(), hs[0].Token)
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while its resource was held: %v", err)
	default:
	}
	require.NoError(t, heldA.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not woken by its own table's release")
	}
}

// Issue 21 item 7: manager_schema.sql said deleting a resource row restarts
// tokens at 1; on a promoted server they restart at the timeline's floor.
// What the comment now states: the next token is greatest(1, (timeline-1)
// << TimelineShift).
func TestDeletedResourceRowRestartsAtTimelineFloor(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	var last int64
	for range 3 {
		l, err := m.TryAcquire(ctx, "r", nil)
		require.NoError(t, err)
		last = l.Token()
		require.NoError(t, l.Release(ctx))
	}
	mustExec(t, pool, "DELETE FROM "+pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()+" WHERE resource = 'r'")
	tl := queryOne[int64](t, pool, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`)
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	defer l.Release(context.WithoutCancel(ctx))
	assert.Equal(t, max(1, (tl-1)<<lease.TimelineShift), l.Token())
	if tl == 1 {
		assert.Less(t, l.Token(), last, "on timeline 1 the restarted token is below those handed out")
	}
}
