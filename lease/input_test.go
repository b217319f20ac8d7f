package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 5: a Ref kept in a form field is client input. A Ref whose
// TTL was changed to 100 years renewed the lease to 2126 on a Manager
// configured for 30s, and Mode 77 was accepted.
func TestResumeTakesNothingFromTheRefThatWidensTheLease(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: 30 * time.Second})
	l, err := m.TryAcquire(ctx, "doc", nil)
	require.NoError(t, err)
	defer l.Release(context.WithoutCancel(ctx))

	forged := l.Ref()
	forged.TTL = 100 * 365 * 24 * time.Hour
	resumed, err := m.Resume(forged)
	require.NoError(t, err)
	require.NoError(t, resumed.Renew(ctx))
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	left := queryOne[float64](t, pool, "SELECT extract(epoch FROM max(expires_at) - now())::float8 FROM "+holders)
	assert.LessOrEqual(t, left, 30.0, "renewed for the Manager's TTL, not the Ref's")

	forged = l.Ref()
	forged.Mode = 77
	_, err = m.Resume(forged)
	assert.ErrorIs(t, err, lease.ErrInvalid)

	forged.Mode = lease.Shared // the lease is exclusive
	shared, err := m.Resume(forged)
	require.NoError(t, err)
	assert.ErrorIs(t, shared.Renew(ctx), lease.ErrLeaseLost, "a Ref edited to another mode matches no row")
	assert.ErrorIs(t, shared.Release(ctx), lease.ErrLeaseLost)
}

// Issue 11 item 5: ColumnRef.ID decoded from JSON as float64, so id 2^53+1
// released the wrong row and the real lease stayed until its TTL. Every Ref
// type must round-trip through encoding/json: int64 ids at the edges,
// string ids, uuid ids.
func TestRefsRoundTripThroughJSON(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)

	roundTrip := func(t *testing.T, col *lease.Column, id any) {
		l, err := col.TryAcquire(ctx, id)
		require.NoError(t, err)
		stored, err := json.Marshal(l.Ref())
		require.NoError(t, err)
		var ref lease.ColumnRef
		require.NoError(t, json.Unmarshal(stored, &ref))
		resumed, err := col.Resume(ref)
		require.NoError(t, err)
		require.NoError(t, resumed.Renew(ctx), "the decoded ref names the same row (%s)", stored)
		require.NoError(t, resumed.Release(ctx))
		require.ErrorIs(t, l.Release(ctx), lease.ErrLeaseLost, "released through the decoded ref")
	}
	t.Run("bigint", func(t *testing.T) {
		ids := []int64{0, 1, -1, 1 << 53, 1<<53 + 1, math.MaxInt64, math.MaxInt64 - 1, math.MinInt64}
		col := usersTable(t, pool, schema, time.Minute, ids...)
		for _, id := range ids {
			roundTrip(t, col, id)
		}
	})
	for _, typ := range []string{"text", "uuid"} {
		t.Run(typ, func(t *testing.T) {
			table := pgx.Identifier{schema, "by_" + typ}.Sanitize()
			mustExec(t, pool, "CREATE TABLE "+table+" (id "+typ+" PRIMARY KEY)")
			ids := []string{"5a1e2f3c-0000-4000-8000-000000000001", "5a1e2f3c-0000-4000-8000-000000000002"}
			for _, id := range ids {
				mustExec(t, pool, "INSERT INTO "+table+" (id) VALUES ($1)", id)
			}
			col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "by_" + typ, TTL: time.Minute})
			require.NoError(t, err)
			require.NoError(t, col.Migrate(ctx))
			for _, id := range ids {
				roundTrip(t, col, id)
			}
		})
	}
	t.Run("manager", func(t *testing.T) {
		m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
		for _, mode := range []lease.Mode{lease.Exclusive, lease.Shared} {
			l, err := m.TryAcquire(ctx, "doc ☃", &lease.AcquireOptions{Mode: mode})
			require.NoError(t, err)
			stored, err := json.Marshal(l.Ref())
			require.NoError(t, err)
			var ref lease.Ref
			require.NoError(t, json.Unmarshal(stored, &ref))
			require.Equal(t, l.Ref(), ref)
			resumed, err := m.Resume(ref)
			require.NoError(t, err)
			require.NoError(t, resumed.Renew(ctx))
			require.NoError(t, resumed.Release(ctx))
		}
	})
	t.Run("refused ids", func(t *testing.T) {
		for _, js := range []string{`{"id":1.5,"owner":"o"}`, `{"id":9223372036854775808,"owner":"o"}`, `{"id":[1],"owner":"o"}`} {
			var ref lease.ColumnRef
			assert.ErrorIs(t, json.Unmarshal([]byte(js), &ref), lease.ErrInvalid, js)
		}
	})
}

// Issue 11 item 5: a TTL below PostgreSQL's interval resolution (30, meaning
// 30ns) gave no exclusion at all. TTLs below MinTTL are refused.
func TestTTLBelowMinimumRefused(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	_, err := lease.NewColumn(pool, lease.ColumnConfig{Table: "users", TTL: 30})
	assert.ErrorIs(t, err, lease.ErrInvalid)
	_, err = lease.NewManager(pool, lease.ManagerConfig{TTL: 30})
	assert.ErrorIs(t, err, lease.ErrInvalid)
	_, err = lease.NewManager(pool, lease.ManagerConfig{TTL: lease.MinTTL - 1})
	assert.ErrorIs(t, err, lease.ErrInvalid)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: lease.MinTTL})
	_, err = m.TryAcquire(ctx, "r", &lease.AcquireOptions{TTL: 30})
	assert.ErrorIs(t, err, lease.ErrInvalid)
	_, err = m.Acquire(ctx, "r", &lease.AcquireOptions{TTL: -time.Second})
	assert.ErrorIs(t, err, lease.ErrInvalid)
	err = m.TryDo(ctx, "r", &lease.DoOptions{Acquire: &lease.AcquireOptions{TTL: 30}}, func(context.Context, *lease.Lease) error { return nil })
	assert.ErrorIs(t, err, lease.ErrInvalid)
}

// Issue 11 item 5: inputs refused up front with a clear error, never a
// server error at first use, and errors of bounded size.
func TestBadInputRefusedClearly(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)

	t.Run("table name limit", func(t *testing.T) {
		_, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute, Table: strings.Repeat("t", 52)})
		require.ErrorIs(t, err, lease.ErrInvalid)
		assert.Contains(t, err.Error(), "51 bytes")
		m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, Table: strings.Repeat("t", 51)})
		l, err := m.TryAcquire(ctx, "r", nil)
		require.NoError(t, err, "a 51-byte table name works")
		require.NoError(t, l.Release(ctx))
	})
	t.Run("schema-qualified table", func(t *testing.T) {
		_, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute, Table: "public.locks"})
		require.ErrorIs(t, err, lease.ErrInvalid)
		assert.Contains(t, err.Error(), "Schema")
		_, err = lease.NewColumn(pool, lease.ColumnConfig{TTL: time.Minute, Table: "public.users"})
		require.ErrorIs(t, err, lease.ErrInvalid)
	})
	t.Run("row ids", func(t *testing.T) {
		col := usersTable(t, pool, schema, time.Minute, 1)
		for name, id := range map[string]any{
			"NUL":          "a\x00b",
			"invalid UTF8": "\xff\xfe",
			"typed nil":    (*int64)(nil),
			"nil":          nil,
		} {
			_, err := col.TryAcquire(ctx, id)
			assert.ErrorIs(t, err, lease.ErrInvalid, name)
			_, err = col.Resume(lease.ColumnRef{ID: id, Owner: "o"})
			assert.ErrorIs(t, err, lease.ErrInvalid, name)
		}
		huge := strings.Repeat("x", 10<<20)
		_, err := col.TryAcquire(ctx, huge)
		require.ErrorIs(t, err, lease.ErrInvalid)
		msg := err.Error()
		assert.Less(t, len(msg), 1024, "a 10 MB id is not copied into the error")
		assert.True(t, strings.Contains(msg, "(10485760 bytes)"), "the error says how long the id was")
	})
	t.Run("metadata jsonb cannot store", func(t *testing.T) {
		m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, Table: "meta"})
		for _, meta := range []string{`{"a":"\u0000"}`, `["x\u0000"]`, `{"\u0000":1}`} {
			_, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Metadata: json.RawMessage(meta)})
			assert.ErrorIs(t, err, lease.ErrInvalid, meta)
		}
		l, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Metadata: json.RawMessage(`{"a":"\\u0000 is text here"}`)})
		require.NoError(t, err, "an escaped backslash is not a NUL")
		require.NoError(t, l.Release(ctx))
		huge := strings.Repeat("r", 10<<20)
		_, err = m.TryAcquire(ctx, huge, nil)
		require.ErrorIs(t, err, lease.ErrInvalid)
		assert.Less(t, len(err.Error()), 1024, "a 10 MB resource is not copied into the error")
	})
}

// Issue 11 item 5: Do's final release was not retried on a dead pooled
// connection, so work that succeeded was reported as failed and the lease
// stayed until its TTL. Here every pooled connection dies while the callback
// runs (the server terminated them); Do must release on a live one.
func TestDoReleaseRetriedOnDeadConnection(t *testing.T) {
	ctx := testCtx(t)
	pool, observer, schema := twoPools(t)
	col := usersTable(t, pool, schema, time.Minute, 1)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	killPool := func() {
		n := queryOne[int](t, observer, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app)
		require.NotZero(t, n)
		require.Eventually(t, func() bool {
			return queryOne[int](t, observer, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
		}, 20*time.Second, 5*time.Millisecond)
	}
	warm := func() { pgtest.IdleConns(ctx, t, pool, 2) } // two idle connections in the pool, both to be killed
	t.Run("manager", func(t *testing.T) {
		warm()
		err := m.TryDo(ctx, "r", nil, func(ctx context.Context, l *lease.Lease) error { killPool(); return nil })
		require.NoError(t, err, "the work succeeded and the lease was released")
		hs, err := m.List(ctx, &lease.ListOptions{IncludeExpired: true})
		require.NoError(t, err)
		assert.Empty(t, hs)
	})
	t.Run("column", func(t *testing.T) {
		warm()
		err := col.TryDo(ctx, int64(1), nil, func(ctx context.Context, l *lease.ColumnLease) error { killPool(); return nil })
		require.NoError(t, err, "the work succeeded and the lease was released")
		l, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err, "the row is free")
		require.NoError(t, l.Release(ctx))
	})
}

// Review 15c: the retry of Do's release drew connections the way the
// first attempt did, and pgxpool pings only connections idle for over a
// second, so with more dead idle connections than the retries (four) Do
// gave up with ErrNotReleased in about 100 ms, and the lease stayed until
// its TTL. A retry now runs on a connection that has just answered a ping.
func TestDoReleaseRetriesOnALiveConnection(t *testing.T) {
	ctx := testCtx(t)
	const conns = 8
	cfg := pgtest.Config(t)
	cfg.MaxConns = conns
	pool := pgtest.NewPool(t, cfg)
	observer := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	col := usersTable(t, pool, schema, time.Minute, 1)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	// every connection of the pool used just now (no ping on the next
	// draw), then ended by the server
	killAll := func() {
		pgtest.IdleConns(ctx, t, pool, conns)
		n := queryOne[int](t, observer, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app)
		require.Equal(t, conns, n)
		require.Eventually(t, func() bool {
			return queryOne[int](t, observer, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
		}, 20*time.Second, 5*time.Millisecond)
	}
	t.Run("manager", func(t *testing.T) {
		err := m.Do(ctx, "r", nil, func(ctx context.Context, l *lease.Lease) error { killAll(); return nil })
		require.NoError(t, err, "the work succeeded and the lease was released")
		hs, err := m.List(ctx, &lease.ListOptions{IncludeExpired: true})
		require.NoError(t, err)
		assert.Empty(t, hs)
	})
	t.Run("column", func(t *testing.T) {
		err := col.TryDo(ctx, int64(1), nil, func(ctx context.Context, l *lease.ColumnLease) error { killAll(); return nil })
		require.NoError(t, err, "the work succeeded and the lease was released")
		l, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err, "the row is free")
		require.NoError(t, l.Release(ctx))
	})
}

// Issue 11 item 5 (seed 000: "the external calls succeeded, the release
// failed"): a release that fails for good after a successful callback is
// reported with its own sentinel, the database error still in the chain.
func TestDoReleaseFailureHasSentinel(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	col := usersTable(t, pool, schema, time.Minute, 1)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	users := pgx.Identifier{schema, "users"}.Sanitize()

	err := m.TryDo(ctx, "r", nil, func(ctx context.Context, l *lease.Lease) error {
		mustExec(t, pool, "ALTER TABLE "+holders+" RENAME TO gone")
		return nil
	})
	require.ErrorIs(t, err, lease.ErrNotReleased)
	assert.NotErrorIs(t, err, lease.ErrLeaseLost)
	assertPgCode(t, err, "42P01")

	err = col.TryDo(ctx, int64(1), nil, func(ctx context.Context, l *lease.ColumnLease) error {
		mustExec(t, pool, "ALTER TABLE "+users+" RENAME COLUMN identity_action_locked_by TO gone")
		return nil
	})
	require.ErrorIs(t, err, lease.ErrNotReleased)
	assertPgCode(t, err, "42703")

	err = col.TryDo(ctx, int64(1), nil, func(ctx context.Context, l *lease.ColumnLease) error {
		return errors.New("the work failed")
	})
	require.Error(t, err, "acquiring fails now that a lock column is gone")
	assert.NotErrorIs(t, err, lease.ErrNotReleased, "nothing was acquired, so nothing was left unreleased")
}

// assertPgCode checks that err carries a *pgconn.PgError with the given SQLSTATE.
func assertPgCode(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if assert.ErrorAs(t, err, &pgErr) {
		assert.Equal(t, code, pgErr.Code)
	}
}

// Review 15c: a column lease whose row is deleted while Do's callback runs
// is lost (the keeper cancels the callback with ErrLeaseLost), and the
// release that then finds no row (ErrNotFound) was reported as
// ErrNotReleased, "the lease may stay held until its TTL", for a lease
// that no longer exists. The same when the row goes before any renewal
// noticed: the loss, not a failed release.
func TestDoRowDeletedIsALossNotAFailedRelease(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	col := usersTable(t, pool, schema, 600*time.Millisecond, 1, 2)
	users := pgx.Identifier{schema, "users"}.Sanitize()

	t.Run("noticed by a renewal", func(t *testing.T) {
		var cause error
		err := col.TryDo(ctx, int64(1), nil, func(ctx context.Context, _ *lease.ColumnLease) error {
			mustExec(t, pool, "DELETE FROM "+users+" WHERE id = 1")
			<-ctx.Done()
			cause = context.Cause(ctx)
			return nil
		})
		require.ErrorIs(t, cause, lease.ErrLeaseLost)
		require.ErrorIs(t, err, lease.ErrLeaseLost)
		assert.NotErrorIs(t, err, lease.ErrNotReleased)
	})
	t.Run("unnoticed", func(t *testing.T) {
		err := col.TryDo(ctx, int64(2), nil, func(ctx context.Context, _ *lease.ColumnLease) error {
			mustExec(t, pool, "DELETE FROM "+users+" WHERE id = 2")
			return nil
		})
		require.ErrorIs(t, err, lease.ErrLeaseLost, "the work was not protected to the end")
		assert.ErrorIs(t, err, lease.ErrNotFound)
		assert.NotErrorIs(t, err, lease.ErrNotReleased)
	})
}
