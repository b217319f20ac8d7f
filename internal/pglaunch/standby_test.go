package pglaunch

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startStandby starts a standby of primary and stops it at cleanup.
func startStandby(t *testing.T, primary *Cluster, opts StandbyOptions) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard, as in start
	defer cancel()
	s, err := primary.StartStandby(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, s.Stop(ctx))
	})
	return s
}

func execSQL(t *testing.T, ctx context.Context, dsn, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	require.NoError(t, err)
}

// rows returns the ids in table t on the server at dsn, in order.
func rows(t *testing.T, ctx context.Context, dsn string) []int {
	t.Helper()
	ids, err := tryRows(ctx, dsn)
	require.NoError(t, err)
	return ids
}

// hasRows reports whether table t at dsn holds exactly want (false while it does not
// exist yet), for polling.
func hasRows(ctx context.Context, dsn string, want ...int) bool {
	ids, err := tryRows(ctx, dsn)
	return err == nil && assert.ObjectsAreEqual(want, ids)
}

func tryRows(ctx context.Context, dsn string) ([]int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	r, err := conn.Query(ctx, "SELECT id FROM t ORDER BY id")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowTo[int])
}

// Asynchronous standby end to end: it streams, a paused standby receives nothing, a
// resumed one catches up, and a promoted one is writable on timeline 2 without the rows
// committed while it was paused.
func TestStandbyStreamPauseResumePromote(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log syncBuffer
	t0 := time.Now()
	primary := start(t, Options{Log: &log})
	t1 := time.Now()
	standby := startStandby(t, primary, StandbyOptions{})
	t.Logf("primary started in %v, standby in %v", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	assert.NotEqual(t, primary.Port(), standby.Port())
	assert.Equal(t, "on", queryString(t, standby.DSN(), "SELECT CASE WHEN pg_is_in_recovery() THEN 'on' ELSE 'off' END"))
	assert.ErrorIs(t, primary.Promote(ctx), ErrNotStandby)
	assert.ErrorIs(t, primary.PauseReplication(ctx), ErrNotStandby)

	// Streams: a row written on the primary appears on the standby.
	execSQL(t, ctx, primary.DSN(), "CREATE TABLE t (id int PRIMARY KEY)")
	execSQL(t, ctx, primary.DSN(), "INSERT INTO t VALUES (1)")
	require.Eventually(t, func() bool {
		return hasRows(ctx, standby.DSN(), 1)
	}, time.Minute, 20*time.Millisecond, "row 1 never reached the standby")

	// The multi-host DSN skips the read-only standby.
	assert.Equal(t, primary.DataDir(), queryString(t, MultiHostDSN(standby, primary), "SHOW data_directory"))

	// Paused: a commit on the primary does not reach the standby; resumed, it does.
	require.NoError(t, standby.PauseReplication(ctx))
	execSQL(t, ctx, primary.DSN(), "INSERT INTO t VALUES (2)")
	assert.Equal(t, "0", queryString(t, standby.DSN(), "SELECT count(*)::text FROM pg_stat_wal_receiver"))
	require.NoError(t, standby.ResumeReplication(ctx))
	require.Eventually(t, func() bool {
		return hasRows(ctx, standby.DSN(), 1, 2)
	}, time.Minute, 20*time.Millisecond, "row 2 never reached the resumed standby")

	// Paused, then promoted: the standby applies everything it received and stops
	// recovery, so what it lacks now it never gets. Row 3 was committed after the pause.
	require.NoError(t, standby.PauseReplication(ctx))
	execSQL(t, ctx, primary.DSN(), "INSERT INTO t VALUES (3)")
	require.NoError(t, standby.Promote(ctx))
	assert.Equal(t, []int{1, 2}, rows(t, ctx, standby.DSN()), "a row committed after the pause reached the standby")
	assert.Equal(t, []int{1, 2, 3}, rows(t, ctx, primary.DSN()))
	assert.Equal(t, "00000002", queryString(t, standby.DSN(), "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"))
	assert.Equal(t, "00000001", queryString(t, primary.DSN(), "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"))
	execSQL(t, ctx, standby.DSN(), "INSERT INTO t VALUES (3)") // writable, and split brain: two primaries
	assert.ErrorIs(t, standby.Promote(ctx), ErrNotStandby)
	assert.ErrorIs(t, standby.PauseReplication(ctx), ErrNotStandby)
	assert.ErrorIs(t, standby.ResumeReplication(ctx), ErrNotStandby)

	// With the old primary stopped, the multi-host DSN finds the promoted standby.
	require.NoError(t, primary.Stop(ctx))
	assert.Equal(t, standby.DataDir(), queryString(t, MultiHostDSN(primary, standby), "SHOW data_directory"))
	assert.Contains(t, log.String(), "promoted port")
}

// A synchronous standby: COMMIT returns once the standby applied it; while replication is
// paused, COMMIT waits (the backend shows wait_event SyncRep) and returns after resume.
// Once promoted, the standby's own commits wait for nobody.
func TestStandbySynchronousCommitWaits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := start(t, Options{})
	t0 := time.Now()
	standby := startStandby(t, primary, StandbyOptions{Synchronous: true})
	t.Logf("synchronous standby started in %v", time.Since(t0).Round(time.Millisecond))
	assert.Equal(t, "remote_apply", queryString(t, primary.DSN(), "SHOW synchronous_commit"))
	assert.Equal(t, "sync", queryString(t, primary.DSN(), "SELECT sync_state FROM pg_stat_replication"))

	execSQL(t, ctx, primary.DSN(), "CREATE TABLE t (id int PRIMARY KEY)")
	execSQL(t, ctx, primary.DSN(), "INSERT INTO t VALUES (1)")
	assert.Equal(t, []int{1}, rows(t, ctx, standby.DSN()), "COMMIT returned before the standby applied it")

	require.NoError(t, standby.PauseReplication(ctx))
	conn, err := pgx.Connect(ctx, primary.DSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO t VALUES (2)")
		done <- err
	}()
	require.Eventually(t, func() bool {
		return queryString(t, primary.DSN(), "SELECT coalesce((SELECT wait_event FROM pg_stat_activity WHERE pid = "+
			strconv.Itoa(int(pid))+"), '')") == "SyncRep"
	}, time.Minute, 20*time.Millisecond, "the commit does not wait for the paused standby")
	select {
	case err := <-done:
		t.Fatalf("COMMIT returned while the synchronous standby was paused: %v", err)
	default:
	}
	require.NoError(t, standby.ResumeReplication(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("COMMIT still waiting after resume")
	}
	assert.Equal(t, []int{1, 2}, rows(t, ctx, standby.DSN()))

	require.NoError(t, primary.Stop(ctx))
	require.NoError(t, standby.Promote(ctx))
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	execSQL(t, wctx, standby.DSN(), "INSERT INTO t VALUES (3)") // would wait forever for a standby
	assert.Equal(t, []int{1, 2, 3}, rows(t, ctx, standby.DSN()))
}

func TestMultiHostDSN(t *testing.T) {
	a, b := &Cluster{port: 5001}, &Cluster{port: 5002}
	dsn := MultiHostDSN(a, b)
	assert.Equal(t, "host=127.0.0.1,127.0.0.1 port=5001,5002 user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write", dsn)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	assert.Equal(t, uint16(5001), cfg.Port)
	require.Len(t, cfg.Fallbacks, 1)
	assert.Equal(t, uint16(5002), cfg.Fallbacks[0].Port)
	assert.NotNil(t, cfg.ValidateConnect, "target_session_attrs=read-write sets a validator")
}
