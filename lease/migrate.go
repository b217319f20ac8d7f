package lease

import (
	"context"
	"crypto/sha256"
	_ "embed" // the manager schema
	"encoding/binary"

	"github.com/jackc/pgx/v5"
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

// Migrate creates the lock-manager tables and indexes if they do not exist,
// in one transaction. It does not create the schema. It is idempotent and
// safe to run concurrently from several processes. ctx governs the whole
// transaction; on any error it rolls back.
func (m *Manager) Migrate(ctx context.Context) error {
	return opError("migrate", "", migrate(ctx, m.pool, m.q.schema))
}

// Migrate adds the three lease columns to the configured table if they are
// missing: locked-at timestamptz NULL, owner text NULL, fence bigint NOT NULL
// DEFAULT 0. Adding columns with a constant default only changes the catalog
// (PostgreSQL 11+), but ALTER TABLE still takes an ACCESS EXCLUSIVE lock on
// the table for that moment, so run it with your other schema migrations;
// or copy ColumnDDL into them instead. ctx governs the transaction.
func (c *Column) Migrate(ctx context.Context) error {
	return opError("migrate", "", migrate(ctx, c.pool, c.migrateSQL))
}

// ColumnDDL returns the ALTER TABLE statement Migrate runs, for use in your
// own migration files.
func (c *Column) ColumnDDL() string { return c.migrateSQL }

const columnMigrateSQL = `ALTER TABLE {t}
	ADD COLUMN IF NOT EXISTS {at} timestamptz,
	ADD COLUMN IF NOT EXISTS {by} text,
	ADD COLUMN IF NOT EXISTS {fence} bigint NOT NULL DEFAULT 0`

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func migrate(ctx context.Context, db beginner, ddl string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
			return err
		}
		// No arguments: pgx sends this through the simple protocol, which
		// accepts several statements in one string.
		_, err := tx.Exec(ctx, ddl)
		return err
	})
}
