package lease_test

import (
	"errors"
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

func TestColumnAcquireRelease(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	c1 := usersTable(t, p1, schema, time.Minute, 42)
	c2, err := lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: time.Minute})
	require.NoError(t, err)

	a, err := c1.TryAcquire(ctx, int64(42))
	require.NoError(t, err)
	assert.Equal(t, int64(1), a.Token())
	assert.Equal(t, "42", a.Resource())

	_, err = c2.TryAcquire(ctx, int64(42))
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	var le *lease.Error
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "try acquire", le.Op)
	assert.Equal(t, "42", le.Resource)
	assert.Equal(t, `lease: try acquire "42": not acquired`, err.Error())

	// The row carries the lease, and nothing else of the row changed.
	owner := queryOne[string](t, p1, "SELECT identity_action_locked_by FROM "+pgx.Identifier{schema, "users"}.Sanitize()+" WHERE id = 42")
	assert.Equal(t, a.Owner(), owner)

	require.NoError(t, a.Renew(ctx))
	require.NoError(t, a.Release(ctx))
	require.ErrorIs(t, a.Release(ctx), lease.ErrLeaseLost, "a second release finds the lease gone")
	require.ErrorIs(t, a.Renew(ctx), lease.ErrLeaseLost)

	b, err := c2.TryAcquire(ctx, int64(42))
	require.NoError(t, err)
	assert.Equal(t, int64(2), b.Token(), "the fence survives release")
	require.ErrorIs(t, a.Release(ctx), lease.ErrLeaseLost, "a stale handle cannot release the new holder's lease")
	require.NoError(t, b.Release(ctx))
}

func TestColumnMissingRowIsNotFound(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	c := usersTable(t, p1, schema, time.Minute, 1)

	_, err := c.TryAcquire(ctx, int64(2))
	require.ErrorIs(t, err, lease.ErrNotFound)
	require.NotErrorIs(t, err, lease.ErrNotAcquired)

	l, err := c.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	mustExec(t, p1, "DELETE FROM "+pgx.Identifier{schema, "users"}.Sanitize()+" WHERE id = 1")
	require.ErrorIs(t, l.Renew(ctx), lease.ErrNotFound)
	require.ErrorIs(t, l.Release(ctx), lease.ErrNotFound)
}

func TestColumnExpiryTakeover(t *testing.T) {
	const ttl = 400 * time.Millisecond
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	c1 := usersTable(t, p1, schema, ttl, 7)
	c2, err := lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: ttl})
	require.NoError(t, err)
	users := pgx.Identifier{schema, "users"}.Sanitize()

	old, err := c1.TryAcquire(ctx, int64(7))
	require.NoError(t, err)
	oldAt := queryOne[time.Time](t, p1, "SELECT identity_action_locked_at FROM "+users+" WHERE id = 7")
	_, err = c2.TryAcquire(ctx, int64(7))
	require.ErrorIs(t, err, lease.ErrNotAcquired)

	// The old holder stops renewing. Time has to pass: poll until the takeover.
	var taken *lease.ColumnLease
	require.Eventually(t, func() bool {
		taken, err = c2.TryAcquire(ctx, int64(7))
		if err != nil {
			require.ErrorIs(t, err, lease.ErrNotAcquired)
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	newAt := queryOne[time.Time](t, p1, "SELECT identity_action_locked_at FROM "+users+" WHERE id = 7")
	assert.GreaterOrEqual(t, newAt.Sub(oldAt), ttl, "taken over only after the TTL, by the database clock")
	assert.Greater(t, taken.Token(), old.Token())

	require.ErrorIs(t, old.Renew(ctx), lease.ErrLeaseLost)
	require.ErrorIs(t, old.Release(ctx), lease.ErrLeaseLost)
	owner := queryOne[string](t, p1, "SELECT identity_action_locked_by FROM "+users+" WHERE id = 7")
	assert.Equal(t, taken.Owner(), owner, "the old holder's calls did not touch the new lease")
	assert.Equal(t, newAt, queryOne[time.Time](t, p1, "SELECT identity_action_locked_at FROM "+users+" WHERE id = 7"))
	require.NoError(t, taken.Renew(ctx))
	require.NoError(t, taken.Release(ctx))
}

func TestColumnRenewKeepsLease(t *testing.T) {
	const ttl = time.Second
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	c1 := usersTable(t, p1, schema, ttl, 1)
	c2, err := lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: ttl})
	require.NoError(t, err)

	l, err := c1.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	// Hold for two TTLs, renewing every TTL/3: nobody else gets in.
	for deadline := time.Now().Add(2 * ttl); time.Now().Before(deadline); {
		time.Sleep(ttl / 3)
		require.NoError(t, l.Renew(ctx))
		_, err := c2.TryAcquire(ctx, int64(1))
		require.ErrorIs(t, err, lease.ErrNotAcquired)
	}
	require.NoError(t, l.Release(ctx))
}

func TestColumnExpiredLeaseCannotBeRenewed(t *testing.T) {
	const ttl = 200 * time.Millisecond
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	c := usersTable(t, p1, schema, ttl, 1)
	l, err := c.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	users := pgx.Identifier{schema, "users"}.Sanitize()
	// Wait on the database clock until the lease is past its TTL.
	require.Eventually(t, func() bool {
		return queryOne[bool](t, p1, "SELECT identity_action_locked_at < now() - $1::interval FROM "+users+" WHERE id = 1", ttl)
	}, 10*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, l.Renew(ctx), lease.ErrLeaseLost)
	require.NoError(t, l.Release(ctx), "releasing an expired lease nobody took is fine")
}

func TestColumnConfigValidation(t *testing.T) {
	p1 := pgtest.Pool(t)
	ok := lease.ColumnConfig{Table: "users", TTL: time.Second}
	for name, mutate := range map[string]func(*lease.ColumnConfig){
		"no table":        func(c *lease.ColumnConfig) { c.Table = "" },
		"zero TTL":        func(c *lease.ColumnConfig) { c.TTL = 0 },
		"negative TTL":    func(c *lease.ColumnConfig) { c.TTL = -time.Second },
		"NUL in table":    func(c *lease.ColumnConfig) { c.Table = "us\x00ers" },
		"NUL in schema":   func(c *lease.ColumnConfig) { c.Schema = "a\x00" },
		"long column":     func(c *lease.ColumnConfig) { c.OwnerColumn = strings.Repeat("x", 64) },
		"bad utf-8":       func(c *lease.ColumnConfig) { c.IDColumn = "\xff" },
		"shared column":   func(c *lease.ColumnConfig) { c.OwnerColumn = "locked_at" },
		"negative bounds": func(c *lease.ColumnConfig) { c.ReleaseTimeout = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ok
			mutate(&cfg)
			_, err := lease.NewColumn(p1, cfg)
			require.ErrorIs(t, err, lease.ErrInvalid)
		})
	}
	_, err := lease.NewColumn(nil, ok)
	require.ErrorIs(t, err, lease.ErrInvalid)
	c, err := lease.NewColumn(p1, ok)
	require.NoError(t, err)
	_, err = c.TryAcquire(testCtx(t), nil)
	require.ErrorIs(t, err, lease.ErrInvalid)
	assert.Contains(t, c.ColumnDDL(), `ADD COLUMN IF NOT EXISTS "lock_fence" bigint NOT NULL DEFAULT 0`)
}

// The owner token is a UUID in text form, so the owner column may be uuid.
func TestColumnUUIDOwnerColumn(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	table := pgx.Identifier{schema, "jobs"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+table+" (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), locked_at timestamptz, locked_by uuid, lock_fence bigint NOT NULL DEFAULT 0)")
	id := queryOne[string](t, p1, "INSERT INTO "+table+" DEFAULT VALUES RETURNING id::text")
	c, err := lease.NewColumn(p1, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
	require.NoError(t, err)
	l, err := c.TryAcquire(ctx, id)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))
}

// A database error (here: a missing column) comes back with the
// *pgconn.PgError in the chain.
func TestColumnKeepsPgError(t *testing.T) {
	p1, _, schema := twoPools(t)
	mustExec(t, p1, "CREATE TABLE "+pgx.Identifier{schema, "bare"}.Sanitize()+" (id int PRIMARY KEY)")
	c, err := lease.NewColumn(p1, lease.ColumnConfig{Schema: schema, Table: "bare", TTL: time.Minute})
	require.NoError(t, err)
	_, err = c.TryAcquire(testCtx(t), 1)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "42703", pgErr.Code) // undefined_column
	assert.NotErrorIs(t, err, lease.ErrNotAcquired)
}
