package lease

import (
	"context"
	"crypto/sha256"
	_ "embed" // the manager schema
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/pooltx"
)

//go:embed manager_schema.sql
var managerSchemaSQL string

// migrateLockKey serialises concurrent migrations (CREATE ... IF NOT EXISTS is
// not safe against a concurrent CREATE of the same name: it can fail with a
// unique violation in the catalogs). It is the first 8 bytes of
// SHA-256("pgxlock/lease/migrate") read as a big-endian signed integer, the
// derivation package keys uses for string keys, taken in the one-bigint key
// space as a transaction-scoped lock, so nothing is left held afterwards.
var migrateLockKey = func() int64 {
	sum := sha256.Sum256([]byte("pgxlock/lease/migrate"))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}()

// MigrateLockTimeout bounds how long Migrate waits for a table lock when the
// schema does need a change: CREATE INDEX takes a SHARE lock and ALTER TABLE
// an ACCESS EXCLUSIVE one, and a migration queued behind a long transaction
// would queue every lease statement behind itself. When it runs out, Migrate
// fails with SQLSTATE 55P03 in the chain and changes nothing; run it again
// when the transaction is gone.
const MigrateLockTimeout = 5 * time.Second

// Migrate creates the lock-manager tables and indexes if they do not exist.
// It first reads the catalog, without locking anything: on an up-to-date
// schema it runs no DDL and takes no lock (one more catalog read follows,
// below), so running it at every start-up never stops lease traffic. Otherwise it runs the DDL in one transaction, serialised with
// concurrent migrations, each table lock bounded by MigrateLockTimeout. It
// does not create the schema. It is idempotent and safe to run concurrently
// from several processes. ctx governs the whole call; on any error the
// transaction rolls back.
//
// It then checks the types of the tables' three time columns (the holders'
// acquired_at and expires_at, the resources' writer_intent_until): a table
// made or altered by hand whose column is not timestamptz of full precision
// (timestamptz(0), say, rounds a lease's expiry by up to half a second, so
// it could be taken over before its holder's trust window closed; a
// timestamp without time zone reads it in the session's TimeZone) is
// refused with ErrInvalid, naming the column and its type.
func (m *Manager) Migrate(ctx context.Context) error {
	if err := migrate(ctx, m.pool, m.q.schema, m.q.upToDate, m.q.upToDateArgs...); err != nil {
		return opError("migrate", "", err)
	}
	rows, err := m.pool.Query(ctx, managerTimeColumnsSQL, m.holders, m.resources)
	if err != nil {
		return opError("migrate", "", err)
	}
	var table, name, typ string
	var bad error
	if _, err := pgx.ForEachRow(rows, []any{&table, &name, &typ}, func() error {
		if bad == nil {
			bad = fmt.Errorf("%w: column %s of %s is %s, not timestamptz of full precision", ErrInvalid, quote(name), table, typ)
		}
		return nil
	}); err != nil {
		return opError("migrate", "", err)
	}
	if bad != nil {
		return opError("migrate", "", bad)
	}
	return nil
}

// managerTimeColumnsSQL lists the lock-manager tables' time columns ($1
// holders, $2 resources) whose type is not timestamptz of full precision
// (typmod -1 or 6): the table's name as given, the column and its type.
const managerTimeColumnsSQL = `
SELECT CASE WHEN a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1) THEN $1 ELSE $2 END,
	a.attname::pg_catalog.text, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE ((a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1) AND a.attname OPERATOR(pg_catalog.=) ANY ('{acquired_at,expires_at}'::pg_catalog.name[]))
	OR (a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($2) AND a.attname OPERATOR(pg_catalog.=) 'writer_intent_until'::pg_catalog.name))
	AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
	AND NOT (a.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.timestamptz'::pg_catalog.regtype::pg_catalog.oid
		AND (a.atttypmod OPERATOR(pg_catalog.=) -1 OR a.atttypmod OPERATOR(pg_catalog.=) 6))
ORDER BY 1, a.attnum`

// Migrate adds the three lease columns to the configured table if they are
// missing: locked-at timestamptz NULL, owner text NULL, fence bigint NOT NULL
// DEFAULT 0. It first reads the catalog, without locking anything, and
// returns at once if the three columns exist (whatever their types: a
// timestamp locked-at column of any precision is fine, see ColumnConfig). Otherwise it runs
// ALTER TABLE, which only changes the catalog (PostgreSQL 11+) but takes an
// ACCESS EXCLUSIVE lock on the table for that moment, bounded by
// MigrateLockTimeout; run it with your other schema migrations, or copy
// ColumnDDL into them instead. It then checks the locked-at column's type,
// through any domains: one that is not timestamptz or timestamp (a date
// column, say, which would truncate now() to the day) is refused with
// ErrInvalid, naming the type; every precision of those two is safe (see
// ColumnConfig). ctx governs the whole call.
func (c *Column) Migrate(ctx context.Context) error {
	if err := migrate(ctx, c.pool, c.migrateSQL, columnsExistSQL, c.table, c.columns); err != nil {
		return opError("migrate", "", err)
	}
	var typ string
	var ok bool
	err := c.pool.QueryRow(ctx, lockedAtTypeSQL, c.table, c.lockedAt).Scan(&typ, &ok)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // not in pg_attribute: the statements will say so
		return nil
	case err != nil:
		return opError("migrate", "", err)
	case !ok:
		return opError("migrate", "", fmt.Errorf("%w: locked-at column %s is %s, not timestamptz or timestamp",
			ErrInvalid, quote(c.lockedAt), typ))
	}
	return nil
}

// lockedAtTypeSQL resolves the locked-at column's type ($1 qualified table,
// $2 column) through domains to its base type: its name, and whether it is
// timestamptz or timestamp (no row when the column is not in the catalog).
var lockedAtTypeSQL = "\nWITH RECURSIVE " + lockedAtTypeCTEs("$1", "$2") + "\nSELECT name, ok FROM lat"

// lockedAtTypeCTEs are the two CTEs (of a WITH RECURSIVE) that resolve the
// locked-at column's type, the qualified table and the column name being
// the parameters table and column, through domains to its base type:
// lat(name, ok), the base type's name and whether it is timestamptz or
// timestamp. Migrate's check (lockedAtTypeSQL) and a Column's first
// acquisitions (checkedAcquireSQL) read it.
func lockedAtTypeCTEs(table, column string) string {
	return `d(oid, typtype, base) AS (
	SELECT ty.oid, ty.typtype, ty.typbasetype
	FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid OPERATOR(pg_catalog.=) a.atttypid
	WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(` + table + `) AND a.attname OPERATOR(pg_catalog.=) ` + column + `::pg_catalog.name
		AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
	UNION ALL
	SELECT b.oid, b.typtype, b.typbasetype FROM pg_catalog.pg_type b JOIN d ON b.oid OPERATOR(pg_catalog.=) d.base
	WHERE d.typtype OPERATOR(pg_catalog.=) 'd'
), lat(name, ok) AS (
	SELECT pg_catalog.format_type(oid, NULL),
		oid OPERATOR(pg_catalog.=) 'pg_catalog.timestamptz'::pg_catalog.regtype::pg_catalog.oid
		OR oid OPERATOR(pg_catalog.=) 'pg_catalog.timestamp'::pg_catalog.regtype::pg_catalog.oid
	FROM d WHERE typtype OPERATOR(pg_catalog.<>) 'd'
)`
}

// ColumnDDL returns the ALTER TABLE statement Migrate runs, for use in your
// own migration files.
func (c *Column) ColumnDDL() string { return c.migrateSQL }

// Its types are named in pg_catalog: it runs under the session's
// search_path, where a schema listed before pg_catalog could hold
// look-alikes (bigint is a keyword, always pg_catalog.int8).
const columnMigrateSQL = `ALTER TABLE {t}
	ADD COLUMN IF NOT EXISTS {at} pg_catalog.timestamptz,
	ADD COLUMN IF NOT EXISTS {by} pg_catalog.text,
	ADD COLUMN IF NOT EXISTS {fence} bigint NOT NULL DEFAULT 0`

// The catalog checks. to_regclass takes no lock and resolves a quoted,
// optionally qualified name as the statements will (search_path included).
const (
	// $1 qualified table, $2 column names.
	columnsExistSQL = `
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) pg_catalog.cardinality($2::pg_catalog.text[]) FROM pg_catalog.pg_attribute
WHERE attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1) AND attname OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])
	AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped`

	// $1..$4 qualified names of the relations the manager schema creates.
	relationsExistSQL = `
SELECT pg_catalog.to_regclass($1) IS NOT NULL AND pg_catalog.to_regclass($2) IS NOT NULL
	AND pg_catalog.to_regclass($3) IS NOT NULL AND pg_catalog.to_regclass($4) IS NOT NULL`
)

func migrate(ctx context.Context, pool *pgxpool.Pool, ddl, check string, args ...any) error {
	upToDate := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (bool, error) {
		var ok bool
		err := q.QueryRow(ctx, check, args...).Scan(&ok)
		return ok, err
	}
	if ok, err := upToDate(pool); err != nil || ok {
		return err
	}
	return pooltx.WithTx(ctx, pool, &pooltx.TxOptions{
		// READ WRITE: a session whose transactions default to read-only
		// (default_transaction_read_only) must still migrate, as every
		// lease statement's BEGIN says READ WRITE too.
		Tx: pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite},
		Preamble: func(b *pgx.Batch) {
			b.Queue(utf8SQL) // names in the DDL are UTF-8, as pgx sends them (see utf8SQL)
			b.Queue("SELECT pg_catalog.pg_advisory_xact_lock($1)", migrateLockKey)
			b.Queue(fmt.Sprintf("SELECT pg_catalog.set_config('lock_timeout', '%dms', true)", MigrateLockTimeout.Milliseconds()))
		},
	}, func(ctx context.Context, tx pgx.Tx) error {
		// A concurrent migration may have done the work while we waited.
		if ok, err := upToDate(tx); err != nil || ok {
			return err
		}
		// No arguments: pgx sends this through the simple protocol, which
		// accepts several statements in one string.
		_, err := tx.Exec(ctx, ddl)
		return err
	})
}
