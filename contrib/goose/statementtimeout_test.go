package pgxlockgoose_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A statement_timeout of the session (role, database or DSN) shorter than
// the bound ends the wait for a busy key: SessionLock reports it as
// advisory.ErrLockTimeout with the server's 57014 in the chain, as advisory
// does (review 27: it matched no sentinel).
func TestSessionLockEndedByStatementTimeoutIsALockTimeout(t *testing.T) {
	ctx := testCtx(t)
	k := keys.Int64(pgtest.UniqueInt64(t))
	holder := pgtest.Pool(t)
	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", mustInt64(k))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = holder.Exec(ctx, "SELECT pg_advisory_unlock_all()") })

	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "300ms"
	pool := pgtest.NewPool(t, cfg)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	c, err := db.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: k, LockTimeout: 30 * time.Second})
	require.NoError(t, err)
	err = l.SessionLock(ctx, c)
	require.ErrorIs(t, err, advisory.ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "57014", pgErr.Code)
}

func mustInt64(k keys.Key) int64 { v, _ := k.Int64(); return v }
