package lease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The package doc: Migrate's DDL names its types and its CHECK's operator in
// pg_catalog, so a schema ahead of pg_catalog on the session's search_path, holding a
// look-alike text type and text = (CVE-2018-1058's pattern), gets nothing of it into
// the tables Migrate creates. Before, the DDL's bare names resolved through the path:
// the holders' mode CHECK was built on the look-alike = (every acquisition then failed
// with 23514) and the columns took the look-alike type.
func TestMigrateIgnoresLookAlikesOnTheSearchPath(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	evil := pgtest.Schema(t, admin)
	q := pgx.Identifier{evil}.Sanitize()
	mustExec(t, admin, `
CREATE FUNCTION `+q+`.text_eq(text, text) RETURNS bool LANGUAGE sql AS $$ SELECT false $$;
CREATE OPERATOR `+q+`.= (LEFTARG = text, RIGHTARG = text, FUNCTION = `+q+`.text_eq);
CREATE DOMAIN `+q+`.text AS pg_catalog.varchar(3);
CREATE DOMAIN `+q+`.timestamptz AS pg_catalog.date;
CREATE DOMAIN `+q+`.jsonb AS pg_catalog.text CHECK (false)`)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = evil + ", pg_catalog, public"
	hostile := pgtest.NewPool(t, cfg)

	// dependsOnEvil counts the dependencies of table's columns and constraints on
	// objects of the look-alike schema.
	dependsOnEvil := func(t *testing.T, table string) int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `
SELECT count(*) FROM pg_depend d
WHERE (d.classid = 'pg_class'::regclass AND d.objid = $1::regclass
	OR d.classid = 'pg_constraint'::regclass AND d.objid IN (SELECT oid FROM pg_constraint WHERE conrelid = $1::regclass))
	AND (d.refclassid = 'pg_type'::regclass AND d.refobjid IN (SELECT oid FROM pg_type WHERE typnamespace = $2::regnamespace)
	OR d.refclassid = 'pg_operator'::regclass AND d.refobjid IN (SELECT oid FROM pg_operator WHERE oprnamespace = $2::regnamespace))`,
			table, q).Scan(&n))
		return n
	}

	t.Run("manager", func(t *testing.T) {
		schema := pgtest.Schema(t, admin)
		m, err := lease.NewManager(hostile, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx))
		for _, table := range []string{lease.DefaultTable, lease.DefaultTable + "_resources"} {
			assert.Zero(t, dependsOnEvil(t, pgx.Identifier{schema, table}.Sanitize()), table)
		}
		// A clean session leases on the tables the hostile one made.
		clean, err := lease.NewManager(admin, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		l, err := clean.TryAcquire(ctx, "a resource name longer than three", &lease.AcquireOptions{Owner: "an owner longer than three", Metadata: []byte(`{"k": "v"}`)})
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	})

	t.Run("column", func(t *testing.T) {
		schema := pgtest.Schema(t, admin)
		table := pgx.Identifier{schema, "jobs"}.Sanitize()
		mustExec(t, admin, "CREATE TABLE "+table+" (id pg_catalog.int8 PRIMARY KEY); INSERT INTO "+table+" VALUES (1)")
		c, err := lease.NewColumn(hostile, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, c.Migrate(ctx))
		assert.Zero(t, dependsOnEvil(t, table))
		clean, err := lease.NewColumn(admin, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
		require.NoError(t, err)
		l, err := clean.TryAcquire(ctx, int64(1))
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	})
}
