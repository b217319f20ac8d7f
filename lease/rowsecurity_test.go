package lease_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// A row-level security policy on the lock-manager table that shows each role
// its own rows must not let two roles each decide from their own rows and
// both hold a resource exclusively: the manager's statements run with
// row_security off, so a statement a policy would filter fails with 42501.
// Roles that bypass row security (the owner, here the superuser that
// migrated) are unaffected. A column lease on a table with a policy keeps
// working: it matches one row by its key, and a hidden row is not found.
func TestRowSecurityOnTheManagerTablesFailsInsteadOfFiltering(t *testing.T) {
	admin, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, admin, schema, lease.ManagerConfig{TTL: time.Minute})
	usersTable(t, admin, schema, time.Minute, 1, 2)
	qschema := pgx.Identifier{schema}.Sanitize()
	holders := pgx.Identifier{schema, "pgxlock_leases"}.Sanitize()
	usersT := pgx.Identifier{schema, "users"}.Sanitize()

	var pools []*lease.Manager
	var columns []*lease.Column
	for i := range 2 {
		role := fmt.Sprintf("pgxlock_rls%d_%d", i, pgtest.UniqueInt64(t)&0xffffffff)
		qrole := pgx.Identifier{role}.Sanitize()
		mustExec(t, admin, "CREATE ROLE "+qrole+" LOGIN NOSUPERUSER NOINHERIT")
		t.Cleanup(func() {
			mustExec(t, admin, "DROP OWNED BY "+qrole)
			mustExec(t, admin, "DROP ROLE "+qrole)
		})
		mustExec(t, admin, "GRANT USAGE ON SCHEMA "+qschema+" TO "+qrole)
		mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+qschema+" TO "+qrole)
		cfg := pgtest.Config(t)
		cfg.ConnConfig.User = role
		p := pgtest.NewPool(t, cfg)
		rm, err := lease.NewManager(p, lease.ManagerConfig{Schema: schema, TTL: time.Minute, Owner: role})
		require.NoError(t, err)
		pools = append(pools, rm)
		c, err := lease.NewColumn(p, usersConfig(schema, time.Minute))
		require.NoError(t, err)
		columns = append(columns, c)
	}
	mustExec(t, admin, "ALTER TABLE "+holders+" ENABLE ROW LEVEL SECURITY")
	mustExec(t, admin, "CREATE POLICY own ON "+holders+" USING (owner = current_user) WITH CHECK (owner = current_user)")

	for i, rm := range pools {
		l, err := rm.TryAcquire(ctx, "payments", &lease.AcquireOptions{Mode: lease.Exclusive})
		assert.Nil(t, l, "role %d", i)
		var le *lease.Error
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &le), "role %d: %v", i, err)
		require.True(t, errors.As(err, &pgErr), "role %d: %v", i, err)
		assert.Equal(t, "42501", pgErr.Code, "role %d: %v", i, err)
	}
	var live int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+holders+" WHERE resource = 'payments'").Scan(&live))
	assert.Zero(t, live, "no holder row was written")

	// The table's owner bypasses the policy: the manager works for it.
	l, err := m.TryAcquire(ctx, "payments", nil)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	// A column lease under a policy that shows each role one row: its own
	// row is leased, the other is not found, nothing fails with 42501.
	mustExec(t, admin, "ALTER TABLE "+usersT+" ENABLE ROW LEVEL SECURITY")
	mustExec(t, admin, "CREATE POLICY one ON "+usersT+" USING ((id = 1) = (current_user LIKE 'pgxlock_rls0_%'))")
	for i, c := range columns {
		mine, other := int64(i+1), int64(2-i)
		cl, err := c.TryAcquire(ctx, mine)
		require.NoError(t, err, "role %d, row %d", i, mine)
		require.NoError(t, cl.Release(ctx))
		_, err = c.TryAcquire(ctx, other)
		assert.ErrorIs(t, err, lease.ErrNotFound, "role %d, row %d", i, other)
	}
}
