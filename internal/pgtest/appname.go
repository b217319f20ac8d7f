package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// AppName borrows a connection of pool the way any user of the pool would
// (pool.Acquire, not pooltx) and returns its application_name and backend
// PID: on a pool of one connection, what the previous borrower left.
func AppName(ctx context.Context, t testing.TB, pool *pgxpool.Pool) (string, uint32) {
	t.Helper()
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	var name string
	require.NoError(t, c.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name))
	return name, c.Conn().PgConn().PID()
}

// LeaveAppName sets application_name on a connection of pool through
// pgxpool alone, which puts the connection back as it is: the state a
// connection can have when pooltx is given it.
func LeaveAppName(ctx context.Context, t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	_, err := pool.Exec(ctx, "SELECT set_config('application_name', $1, false)", pgx.QueryExecModeSimpleProtocol, name)
	require.NoError(t, err)
}
