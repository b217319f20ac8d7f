package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// appNamePrefix starts the application_name of every pool made here.
const appNamePrefix = "pgxlock-test-"

// checkerAppName is the application_name of the harness's own checking connections.
const checkerAppName = "pgxlock-test-checker"

// leakSettle is how long the end-of-test check waits for advisory locks to go: a backend
// whose client has just disconnected releases its locks a moment later.
var leakSettle = 10 * time.Second // generous: a loaded machine may take seconds to end a backend

// Config returns a fresh pool configuration for the test database ([DSN]), with:
//   - RuntimeParams["application_name"] = "pgxlock-test-<test name>-<random>", unique to
//     this call (at most 63 bytes, PostgreSQL's limit, so pg_stat_activity shows it whole);
//   - MaxConns 4, unless the DSN sets pool_max_conns;
//   - a 10 s connect timeout, unless the DSN sets connect_timeout.
//
// The caller may change it before passing it to [NewPool].
func Config(t testing.TB) *pgxpool.Config {
	t.Helper()
	dsn := DSN(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: parse test database DSN %s: %v", redact(dsn), err)
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(t)
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = 4
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	return cfg
}

// SetOnConnect makes cfg's AfterConnect run stmts, in order, each in the
// simple protocol (so that a statement's own settings, such as
// standard_conforming_strings, do not stop the next), as a pool's set-up
// of a session would: the state the library's resets must keep.
func SetOnConnect(cfg *pgxpool.Config, stmts ...string) {
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		for _, sql := range stmts {
			if _, err := c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
		return nil
	}
}

// NewPool creates a pool from cfg (nil means [Config](t)) and checks that it connects,
// failing the test otherwise. A cfg without an application_name gets a unique one.
//
// At cleanup, before closing the pool, it checks pg_locks through a separate connection
// (fresh context, bounded) and fails the test listing any advisory lock still held or
// awaited by a backend with the pool's application_name, after waiting up to two seconds
// for locks of just-closed connections to go. Then it closes the pool, and fails the test
// if that does not finish within 10 s (a connection or transaction was never released).
func NewPool(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	if cfg == nil {
		cfg = Config(t)
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	app := cfg.ConnConfig.RuntimeParams["application_name"]
	if app == "" {
		app = appName(t)
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: create pool: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("pgtest: connect to the test database: %v", err)
	}
	t.Cleanup(func() {
		checkNoLocksLeft(t, pool, app)
		closePool(t, pool, app)
	})
	return pool
}

// Pool returns a new pool for this test: NewPool(t, nil).
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewPool(t, nil)
}

// checkNoLocksLeft is NewPool's end-of-test check.
func checkNoLocksLeft(t testing.TB, pool *pgxpool.Pool, app string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := checkerConn(ctx, pool)
	if err != nil {
		t.Logf("pgtest: could not connect to check the advisory locks of pool %q: %v", app, err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(leakSettle)
	for {
		locks, err := AdvisoryLocks(ctx, conn, app)
		if err != nil {
			t.Errorf("pgtest: check advisory locks of pool %q: %v", app, err)
			return
		}
		if len(locks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("pgtest: at the end of the test, backends of pool %q still hold or await advisory locks:\n%s",
				app, formatLocks(locks))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closePool closes the pool, failing the test if Close hangs on a connection never
// released.
func closePool(t testing.TB, pool *pgxpool.Pool, app string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pool.Close()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("pgtest: pool %q did not close within 10s: %d connections still acquired (a *pgxpool.Conn or pgx.Tx was never released)",
			app, pool.Stat().AcquiredConns())
	}
}

// AssertNoAdvisoryLocks fails the test if a backend with the pool's application_name holds
// or awaits an advisory lock right now (one query, no waiting). It queries through a
// separate connection, so it works while the test holds every connection of the pool.
func AssertNoAdvisoryLocks(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	if app == "" {
		t.Errorf("pgtest: the pool has no application_name; create it with pgtest.NewPool or pgtest.Config")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := checkerConn(ctx, pool)
	if err != nil {
		t.Errorf("pgtest: connect to check advisory locks of pool %q: %v", app, err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	locks, err := AdvisoryLocks(ctx, conn, app)
	if err != nil {
		t.Errorf("pgtest: check advisory locks of pool %q: %v", app, err)
		return
	}
	if len(locks) > 0 {
		t.Errorf("pgtest: backends of pool %q hold or await advisory locks:\n%s", app, formatLocks(locks))
	}
}

// checkerConn opens a connection to the pool's server with the pool's connection settings
// (dialer, TLS, credentials) but none of its observers, and its own application_name.
func checkerConn(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	cc := pool.Config().ConnConfig // a copy
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = checkerAppName
	// The checker's query names pg_catalog's relations, but its operators
	// and casts would follow a search_path the test set on the pool.
	cc.RuntimeParams["search_path"] = "pg_catalog"
	cc.Tracer = nil
	cc.OnNotice = nil
	cc.OnNotification = nil
	if cc.ConnectTimeout == 0 || cc.ConnectTimeout > 10*time.Second {
		cc.ConnectTimeout = 10 * time.Second
	}
	return pgx.ConnectConfig(ctx, cc)
}

// appName makes "pgxlock-test-<sanitized test name>-<8 random hex>", at most 63 bytes.
func appName(t testing.TB) string {
	const maxLen = 63 // NAMEDATALEN - 1: the server truncates longer names
	suffix := "-" + randomHex(4)
	var b strings.Builder
	for _, r := range t.Name() {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	name := b.String()
	if room := maxLen - len(appNamePrefix) - len(suffix); len(name) > room {
		name = name[:room]
	}
	return appNamePrefix + name + suffix
}

// randomHex returns 2n random hex characters.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

// IdleConns leaves n connections idle in pool, all just used (pgxpool
// pings only connections idle for over a second before handing them out):
// it acquires n at once, then releases them.
func IdleConns(ctx context.Context, t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatalf("pgtest: acquire connection %d of %d: %v", i+1, n, err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}
