package lease_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// TestLatin1DatabaseUntranslatableText pins the documented behaviour on a
// database whose encoding is not UTF8 (the reviewer's LATIN1 finding): a
// jsonb \u escape of a character the encoding cannot represent is not found
// out before SQL; the server refuses it with SQLSTATE 22P05 in the chain of
// an *Error (not ErrInvalid), and nothing is acquired.
func TestLatin1DatabaseUntranslatableText(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.NewPool(t, latin1Database(t, "l1"))
	m, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctx))

	_, err = m.TryAcquire(ctx, "r", &lease.AcquireOptions{Metadata: json.RawMessage(`{"k":"\u4e2d"}`)})
	t.Logf("metadata with \\u4e2d: %v", err)
	var e *lease.Error
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &e), "%T %v", err, err)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "22P05", pgErr.Code)
	assert.NotErrorIs(t, err, lease.ErrInvalid)
	hs, err := m.List(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, hs, "nothing acquired")
	l, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Metadata: json.RawMessage(`{"k":"\u00e9"}`)})
	require.NoError(t, err, "an escape LATIN1 can represent is fine")
	require.NoError(t, l.Release(ctx))
}

// latin1Database creates database name, encoded LATIN1, on a throwaway
// cluster of the test's own (databases are cluster-wide: not on the shared
// server), and returns a pool configuration for it.
func latin1Database(t *testing.T, name string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.Cluster(t).DSN())
	require.NoError(t, err)
	_, err = pgtest.NewPool(t, cfg).Exec(testCtx(t), "CREATE DATABASE "+name+" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	require.NoError(t, err)
	cfg = cfg.Copy()
	cfg.ConnConfig.Database = name
	return cfg
}
