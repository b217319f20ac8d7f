package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The listener's doc: the dedicated LISTEN connection turns idle_session_timeout off,
// as it sits idle by design. It copied the pool's runtime parameters and kept the
// timeout: with idle_session_timeout = 300ms on the pool (as a role, a database or a
// DSN may set it, PostgreSQL 14 and later), the server ended the waiting listener's
// session every 300ms (FATAL 57P05), and waiters polled until it came back.
//
// The event waited on is the end of a probe session with the same timeout, opened after
// the listener was seen in LISTEN, so idle for less time than the listener: once the
// server has ended it, a listener that kept the timeout has been ended too.
func TestListenConnectionOutlivesIdleSessionTimeout(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t) // no idle_session_timeout: observes, and holds the lease
	schema := pgtest.Schema(t, admin)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "300ms"
	pool := pgtest.NewPool(t, cfg)
	app := cfg.ConnConfig.RuntimeParams["application_name"]

	holder := newManager(t, admin, schema, lease.ManagerConfig{TTL: time.Minute})
	// A poll interval (and so a reconnect backoff) of an hour: a listener the server
	// ended is not replaced during the test.
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})
	held, err := holder.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(context.WithoutCancel(ctx))) }()

	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waited := make(chan error, 1)
	go func() {
		l, err := m.Acquire(wctx, "r", nil)
		if err == nil {
			err = errors.Join(errors.New("acquired a held lease"), l.Release(ctx))
		}
		waited <- err
	}()
	defer func() {
		stopWaiting()
		require.ErrorIs(t, <-waited, lease.ErrNotAcquired, "the waiter gave up when told to")
	}()

	// The listener: the one backend of the pool's application_name whose last
	// statement is LISTEN (the pool's own connections run the lease statements).
	listeners := func() []uint32 {
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND query = 'LISTEN ' || $2 ORDER BY pid`,
			app, pgx.Identifier{m.Channel()}.Sanitize())
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
		require.NoError(t, err)
		return pids
	}
	var pid uint32
	require.Eventually(t, func() bool {
		pids := listeners()
		if len(pids) == 1 {
			pid = pids[0]
		}
		return len(pids) == 1
	}, 20*time.Second, 5*time.Millisecond, "the waiter never started listening")

	// The probe: the pool's connection settings, idle_session_timeout included, under
	// an application_name of its own.
	pcfg := pool.Config().ConnConfig // a copy
	pcfg.RuntimeParams["application_name"] = app + "-probe"
	probe, err := pgx.ConnectConfig(ctx, pcfg)
	require.NoError(t, err)
	defer probe.Close(context.WithoutCancel(ctx))
	probePID := probe.PgConn().PID()
	require.Eventually(t, func() bool {
		return queryOne[int](t, admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", probePID) == 0
	}, 30*time.Second, 5*time.Millisecond, "the server never ended the idle probe session")
	_, err = probe.Exec(ctx, "SELECT 1")
	var pgErr *pgconn.PgError
	if assert.ErrorAs(t, err, &pgErr, "the probe's session was ended") {
		assert.Equal(t, "57P05", pgErr.Code, "ended by idle_session_timeout: %v", pgErr)
	}

	assert.Equal(t, []uint32{pid}, listeners(), "the listener's session outlived the idle_session_timeout")
}
