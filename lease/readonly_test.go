package lease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Migrate's doc: idempotent and safe at every start-up. A session whose transactions
// default to read-only (default_transaction_read_only on the role, the database or the
// DSN) must still migrate, as every lease statement, whose BEGIN says READ WRITE, still
// works there. Migrate began its transaction without an access mode (review 21): CREATE
// TABLE failed with SQLSTATE 25006, in every exec mode.
func TestMigrateUnderReadOnlyDefaultTransactions(t *testing.T) {
	ctx := testCtx(t)
	for _, params := range []map[string]string{
		{"default_transaction_read_only": "on"},
		{"default_transaction_read_only": "on", "default_transaction_isolation": "serializable", "default_transaction_deferrable": "on"},
	} {
		cfg := pgtest.Config(t)
		for k, v := range params {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		pool := pgtest.NewPool(t, cfg)
		schema := pgtest.Schema(t, pgtest.Pool(t))
		m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx), "%v", params)
		require.NoError(t, m.Migrate(ctx), "up to date: %v", params)
		l, err := m.TryAcquire(ctx, "ro", nil)
		require.NoError(t, err, "%v", params)
		require.NoError(t, l.Release(ctx))
	}
}

// exec's doc: a pooled connection whose session the server ended while it sat idle in
// the pool (idle_session_timeout under a second, pg_terminate_backend, a restart)
// answers with the FATAL error it sent before closing; nothing ran, and the call runs
// once more on a live connection. pgxpool pings only connections idle for over a second:
// TryAcquire on such a connection failed with the FATAL error (review 21: with
// idle_session_timeout = 300ms, two or three of six contending Do calls failed with
// SQLSTATE 57P05).
func TestLeaseCallOnAConnectionThatDiedIdleRunsOnALiveOne(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	schema := pgtest.Schema(t, admin)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctx))
	for _, name := range []string{"first", "second"} {
		var pid uint32
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)) // the pool's one connection, now idle
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 10000)", int64(pid)).Scan(&ok))
		require.True(t, ok, "the idle backend ended")
		l, err := m.TryAcquire(ctx, name, nil)
		require.NoError(t, err, "a call that drew a connection the server had ended runs on a live one")
		require.NoError(t, l.Release(ctx))
	}
}
