package pgtest

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Main waits for pgx's background closes, and only for them: a close that is still
// running is counted (and awaitAsyncCloses returns at its bound), and one that has ended
// is not. The close is held in its first step, the cancel request's dial, until the test
// lets it go.
func TestAwaitAsyncClosesWaitsForPgxBackgroundCloses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(DSN(t))
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = appName(t)
	release := make(chan struct{})
	var armed atomic.Bool
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if armed.Load() { // the cancel request sent by asyncClose
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return dial(ctx, network, addr)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()
	armed.Store(true)

	qctx, qcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := conn.Exec(qctx, "SELECT pg_sleep(60)"); done <- err }()
	admin, err := pgx.Connect(ctx, DSN(t))
	require.NoError(t, err)
	defer admin.Close(context.Background())
	require.Eventually(t, func() bool {
		var active bool
		err := admin.QueryRow(ctx, "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&active)
		return err == nil && active
	}, 30*time.Second, 5*time.Millisecond, "the query never ran")
	qcancel() // pgx closes the interrupted connection in the background
	require.Error(t, <-done)
	require.True(t, conn.IsClosed())

	assert.GreaterOrEqual(t, countAsyncCloses(), 1, "the held close is counted")
	assert.GreaterOrEqual(t, awaitAsyncCloses(50*time.Millisecond), 1, "the wait is bounded")
	close(release)
	assert.Zero(t, awaitAsyncCloses(asyncCloseBound), "the close ended once let go")
	// The cancel request and Terminate reached the server: the backend goes.
	require.Eventually(t, func() bool {
		var n int
		return admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n) == nil && n == 0
	}, 30*time.Second, 5*time.Millisecond)
}
