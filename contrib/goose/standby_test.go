package pgxlockgoose_test

import (
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// A hot standby grants advisory locks against its own sessions only: with the key held
// on the primary, SessionLock on a standby's connection was granted (the sixth review).
// It now fails with advisory.ErrStandby and locks nothing there.
func TestSessionLockerRefusesAStandby(t *testing.T) {
	ctx := testCtx(t)
	primary, standby := pgtest.Replicated(t, pglaunch.StandbyOptions{})
	v := pgtest.UniqueInt64(t)
	sqlConn := func(dsn string) *sql.Conn { // closed at the test's end, with its *sql.DB
		db, err := sql.Open("pgx", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	_, err := sqlConn(primary.DSN()).ExecContext(ctx, "SELECT pg_advisory_lock($1)", v)
	require.NoError(t, err)

	conn := sqlConn(standby.DSN())
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(v)})
	require.NoError(t, err)
	err = l.SessionLock(ctx, conn)
	require.ErrorIs(t, err, advisory.ErrStandby)
	var n int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&n))
	assert.Zero(t, n, "nothing locked on the standby")
}
