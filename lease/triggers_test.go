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

// The package doc's "Triggers, rules and partitions", one sentence each.
func TestTriggersOnAColumnLeasesTable(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	// setup makes a users table with row 1 and a trigger of the given
	// timing running body.
	setup := func(t *testing.T, timing, body string) (col *lease.Column, schema, users string) {
		schema = pgtest.Schema(t, pool)
		col = usersTable(t, pool, schema, time.Minute, 1)
		users = pgx.Identifier{schema, "users"}.Sanitize()
		fn := pgx.Identifier{schema, "trg"}.Sanitize()
		mustExec(t, pool, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "+body+" END$$")
		mustExec(t, pool, "CREATE TRIGGER trg "+timing+" UPDATE ON "+users+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
		return col, schema, users
	}
	t.Run("an audit trigger is fine", func(t *testing.T) {
		schema := pgtest.Schema(t, pool)
		audit := pgx.Identifier{schema, "audit"}.Sanitize()
		mustExec(t, pool, "CREATE TABLE "+audit+" (id bigint)")
		col, _, _ := setup(t, "AFTER", "INSERT INTO "+audit+" VALUES (NEW.id); RETURN NULL;")
		l, err := col.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		require.NoError(t, l.Renew(ctx))
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, int64(3), queryOne[int64](t, pool, "SELECT count(*) FROM "+audit))
	})
	t.Run("a raised error fails the call and changes nothing", func(t *testing.T) {
		col, _, users := setup(t, "BEFORE", "RAISE EXCEPTION 'no' USING ERRCODE = 'P0001';")
		_, err := col.TryAcquire(ctx, int64(1))
		var le *lease.Error
		require.ErrorAs(t, err, &le)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "P0001", pgErr.Code)
		assert.True(t, queryOne[bool](t, pool, "SELECT identity_action_locked_at IS NULL FROM "+users+" WHERE id = 1"))
	})
	t.Run("a raised 55P03 reads as busy", func(t *testing.T) {
		col, _, _ := setup(t, "BEFORE", "RAISE EXCEPTION 'no' USING ERRCODE = '55P03';")
		_, err := col.TryAcquire(ctx, int64(1))
		require.ErrorIs(t, err, lease.ErrNotAcquired)
	})
	t.Run("a trigger that keeps the fence makes tokens repeat", func(t *testing.T) {
		col, _, _ := setup(t, "BEFORE", "NEW.identity_action_fence := OLD.identity_action_fence; RETURN NEW;")
		var tokens []int64
		for range 2 {
			l, err := col.TryAcquire(ctx, int64(1))
			require.NoError(t, err, "nothing detects it")
			tokens = append(tokens, l.Token())
			require.NoError(t, l.Release(ctx))
		}
		assert.Equal(t, tokens[0], tokens[1])
	})
}

// "Triggers, rules and partitions": on a table partitioned by the fence
// column, an acquisition that waited for a racing one's row lock fails
// with the server's 40001 once that one commits (the row moved to another
// partition), not ErrNotAcquired.
func TestAColumnTablePartitionedByTheFence(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	users := pgx.Identifier{schema, "users"}.Sanitize()
	mustExec(t, pool, "CREATE TABLE "+users+` (id bigint NOT NULL, identity_action_locked_at timestamptz,
		identity_action_locked_by text, identity_action_fence bigint NOT NULL DEFAULT 0)
		PARTITION BY LIST ((identity_action_fence % 2))`)
	for i := range 2 {
		part := pgx.Identifier{schema, fmt.Sprintf("users_%d", i)}.Sanitize()
		mustExec(t, pool, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES IN (%d)", part, users, i))
	}
	mustExec(t, pool, "INSERT INTO "+users+" (id) VALUES (1)")
	col, err := lease.NewColumn(pool, usersConfig(schema, time.Minute))
	require.NoError(t, err)
	require.NoError(t, col.Migrate(ctx))
	// Each attempt races the library's acquisition with an uncommitted
	// move of the row; the library waits at most TryLockTimeout for the row
	// lock, so a commit that comes later reads as busy: try again.
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "never saw the 40001")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "UPDATE "+users+" SET identity_action_fence = identity_action_fence + 1 WHERE id = 1")
		require.NoError(t, err)
		var xid int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid))
		errc := make(chan error, 1)
		go func() { _, err := col.TryAcquire(ctx, int64(1)); errc <- err }()
		require.Eventually(t, func() bool {
			return queryOne[bool](t, pool, "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text::bigint = $1", xid)
		}, 10*time.Second, time.Millisecond)
		require.NoError(t, tx.Commit(ctx))
		err = <-errc
		if errors.Is(err, lease.ErrNotAcquired) {
			continue // committed after TryLockTimeout
		}
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "40001", pgErr.Code)
		return
	}
}
