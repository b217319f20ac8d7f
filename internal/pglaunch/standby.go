package pglaunch

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotStandby is returned by [Cluster.Promote], [Cluster.PauseReplication] and
// [Cluster.ResumeReplication] on a cluster that is not a standby made by
// [Cluster.StartStandby], or one already promoted.
var ErrNotStandby = errors.New("pglaunch: not a standby")

// StandbyOptions configures [Cluster.StartStandby]. The zero value is asynchronous
// streaming replication.
type StandbyOptions struct {
	// Synchronous sets synchronous_standby_names = '*' and synchronous_commit =
	// remote_apply on the primary (ALTER SYSTEM, once the standby streams), so a COMMIT on
	// the primary returns only once the standby has applied it: a committed row is visible
	// on the standby when COMMIT returns, and survives a promotion. While replication is
	// paused, commits on the primary wait.
	Synchronous bool
}

// standbyState is the replication state of a cluster made by StartStandby.
type standbyState struct {
	primary  *Cluster
	conninfo string // primary_conninfo as pg_basebackup -R wrote it, restored by Resume
	promoted bool
}

// slotSeq numbers replication slots, so standbys of one primary get distinct slots.
var slotSeq atomic.Int64

// pollEvery is the pause between two polls of a server state.
const pollEvery = 20 * time.Millisecond

// StartStandby makes a streaming standby of c (the primary): pg_basebackup -R (with a
// physical replication slot, so the primary keeps the WAL a paused standby has not
// received) into a new temporary directory, started on its own free port with the
// primary's [Options.Settings], hot standby on. It returns once the standby streams (and,
// with opts.Synchronous, once the primary counts it as synchronous). ctx bounds the whole
// start. Stop the standby with [Cluster.Stop]; on error nothing of it is left behind.
func (c *Cluster) StartStandby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return nil, ErrStopped
	}
	t0 := time.Now()
	r := *c.r
	r.dir = ""
	dir, err := makeClusterDir(&r)
	if err != nil {
		return nil, err
	}
	r.dir = dir
	s := &Cluster{
		binDir:   c.binDir,
		dir:      dir,
		dataDir:  filepath.Join(dir, "data"),
		logFile:  filepath.Join(dir, "server.log"),
		r:        &r,
		log:      c.log,
		settings: c.settings,
		standby:  &standbyState{primary: c},
	}
	ok := false
	defer func() {
		if !ok {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = s.Stop(cctx)
		}
	}()

	slot := "pglaunch_standby_" + strconv.FormatInt(slotSeq.Add(1), 10)
	_, err = s.r.run(ctx, s.bin("pg_basebackup"), "-D", s.dataDir, "-R", "-X", "stream",
		"-c", "fast", "--no-sync", "-C", "-S", slot,
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", c.port))
	if err != nil {
		return nil, err
	}
	copied := time.Now()
	if err := s.configureAndStart(ctx, s.settings); err != nil {
		return nil, err
	}
	started := time.Now()
	if err := s.awaitStreaming(ctx); err != nil {
		return nil, err
	}
	if s.standby.conninfo, err = queryText(ctx, s.DSN(), "SHOW primary_conninfo"); err != nil {
		return nil, err
	}
	if opts.Synchronous {
		if err := c.exec(ctx,
			"ALTER SYSTEM SET synchronous_standby_names = '*'",
			"ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
			"SELECT pg_reload_conf()"); err != nil {
			return nil, err
		}
		if err := poll(ctx, "the primary to count the standby as synchronous", func(ctx context.Context) (bool, error) {
			n, err := queryText(ctx, c.DSN(), "SELECT count(*)::text FROM pg_stat_replication WHERE sync_state = 'sync'")
			if err != nil {
				return false, err
			}
			v, err := queryText(ctx, c.DSN(), "SHOW synchronous_commit")
			return n != "0" && v == "remote_apply", err
		}); err != nil {
			return nil, err
		}
	}
	c.r.logf("standby of port %d on port %d in %s (synchronous %v): base backup %v, start %v, streaming %v, total %v",
		c.port, s.port, s.dir, opts.Synchronous,
		copied.Sub(t0).Round(time.Millisecond), started.Sub(copied).Round(time.Millisecond),
		time.Since(started).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	ok = true
	return s, nil
}

// Promote ends recovery on this standby (SELECT pg_promote(true, 60)) and waits until it
// accepts writes in new sessions. The promoted cluster's settings drop the synchronous
// replication a Synchronous StartStandby set on its primary (a copy of which its data
// directory may carry), so its commits wait for nobody. ctx bounds the whole call. It
// returns [ErrNotStandby] on a cluster that is not an unpromoted standby.
func (c *Cluster) Promote(ctx context.Context) error {
	if !c.isStandby() {
		return ErrNotStandby
	}
	t0 := time.Now()
	v, err := queryText(ctx, c.DSN(), "SELECT pg_promote(true, 60)::text")
	if err != nil {
		return fmt.Errorf("pglaunch: promote port %d: %w", c.port, err)
	}
	if v != "true" {
		return fmt.Errorf("pglaunch: promote port %d: pg_promote returned %s", c.port, v)
	}
	if err := c.exec(ctx,
		"ALTER SYSTEM RESET synchronous_standby_names",
		"ALTER SYSTEM RESET synchronous_commit",
		"SELECT pg_reload_conf()"); err != nil {
		return err
	}
	err = poll(ctx, "the promoted standby to accept writes", func(ctx context.Context) (bool, error) {
		ro, err := queryText(ctx, c.DSN(), "SELECT current_setting('transaction_read_only') || ' ' || current_setting('synchronous_standby_names')")
		return ro == "off ", err
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.standby.promoted = true
	c.mu.Unlock()
	c.r.logf("promoted port %d in %v", c.port, time.Since(t0).Round(time.Millisecond))
	return nil
}

// PauseReplication stops this standby from receiving WAL: primary_conninfo = ” (ALTER
// SYSTEM) and a reload, then it waits until no WAL receiver runs and the setting is seen
// empty. After it returns, nothing the primary commits reaches the standby until
// [Cluster.ResumeReplication] (WAL received before may still be applied). With a
// synchronous standby, commits on the primary wait meanwhile. It returns [ErrNotStandby]
// on a cluster that is not an unpromoted standby.
func (c *Cluster) PauseReplication(ctx context.Context) error {
	if !c.isStandby() {
		return ErrNotStandby
	}
	if err := c.exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return poll(ctx, "the WAL receiver to stop", func(ctx context.Context) (bool, error) {
		v, err := queryText(ctx, c.DSN(),
			"SELECT (SELECT count(*) FROM pg_stat_wal_receiver)::text || ' ' || current_setting('primary_conninfo')")
		return v == "0 ", err
	})
}

// ResumeReplication undoes [Cluster.PauseReplication]: primary_conninfo back to what
// pg_basebackup -R wrote, a reload, then it waits until the WAL receiver streams again. It
// returns [ErrNotStandby] on a cluster that is not an unpromoted standby.
func (c *Cluster) ResumeReplication(ctx context.Context) error {
	if !c.isStandby() {
		return ErrNotStandby
	}
	if err := c.exec(ctx, "ALTER SYSTEM SET primary_conninfo = "+quoteLiteral(c.standby.conninfo), "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return c.awaitStreaming(ctx)
}

// MultiHostDSN returns a keyword/value connection string listing the clusters in order
// (host=127.0.0.1,127.0.0.1,... port=p1,p2,...) with target_session_attrs=read-write, so
// pgx connects to the first that accepts writes: after a promotion, the promoted standby.
// Append more keywords (e.g. " connect_timeout=5") as needed.
func MultiHostDSN(cs ...*Cluster) string {
	hosts := make([]string, len(cs))
	ports := make([]string, len(cs))
	for i, c := range cs {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(c.port)
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","))
}

// isStandby reports whether c is a standby not yet promoted.
func (c *Cluster) isStandby() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.standby != nil && !c.standby.promoted
}

// awaitStreaming waits until this standby's WAL receiver streams.
func (c *Cluster) awaitStreaming(ctx context.Context) error {
	return poll(ctx, "the standby to stream", func(ctx context.Context) (bool, error) {
		v, err := queryText(ctx, c.DSN(), "SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), 'none')")
		return v == "streaming", err
	})
}

// exec runs statements in order on one new connection to c.
func (c *Cluster) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		return fmt.Errorf("pglaunch: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pglaunch: port %d: %s: %w", c.port, s, err)
		}
	}
	return nil
}

// queryString runs a query returning one text value on a new connection.
func queryText(ctx context.Context, dsn, sql string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("pglaunch: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		return "", fmt.Errorf("pglaunch: %s: %w", sql, err)
	}
	return v, nil
}

// poll calls cond every pollEvery until it returns true or ctx ends. A cond error is
// remembered (the server may be restarting) and reported if ctx ends.
func poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	var last error
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		done, err := cond(qctx)
		cancel()
		if done && err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pglaunch: waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(pollEvery):
		}
	}
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings on, the
// default since PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
