package pgxlockmigrate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pgxlockmigrate "github.com/pgxlock/pgxlock/contrib/migrate"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func bigint(k keys.Key) string {
	n, _ := k.Int64()
	return fmt.Sprintf("bigint %d", n)
}

// helperEnv carries a helperSpec (JSON) to a re-executed test binary.
const helperEnv = "PGXLOCK_MIGRATE_TEST_HELPER"

type helperSpec struct {
	DSN    string
	App    string
	Schema string
	N      int
	Gate   int64
	Stock  bool // the stock pgx/v5 driver's lock instead of this package's
}

// TestHelperProcess is not a test: it is the body of the child processes of
// the tests below, run when helperEnv is set. Run directly it returns.
func TestHelperProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var spec helperSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(spec.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	inner, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{SchemaName: spec.Schema})
	require.NoError(t, err)
	var drv database.Driver = inner
	var d *pgxlockmigrate.Driver
	if !spec.Stock {
		d, err = pgxlockmigrate.Wrap(ctx, inner, pool, pgxlockmigrate.Config{SchemaName: spec.Schema, LockTimeout: 30 * time.Second})
		require.NoError(t, err)
		drv = d
	}
	src, err := migrations(spec.Schema, spec.N, spec.Gate)
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	require.NoError(t, err)
	defer m.Close()
	if d != nil {
		d.Attach(m)
	} else {
		m.LockTimeout = 30 * time.Second
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		t.Fatalf("Up: %v", err)
	}
}

func startHelper(t *testing.T, ctx context.Context, spec helperSpec) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

// Four OS processes, two on this package's lock and two on the stock
// driver's, run Up at once: each migration is applied exactly once and
// every process exits 0.
func TestProcessesRacingUpApplyEachMigrationOnce(t *testing.T) {
	ctx := testCtx(t)
	f := newFixture(t, 4, 0)
	// The migrations table exists before the children start, as it would
	// after a first deployment (the stock driver creates it under its own
	// lock when it is built).
	f.replica(t, ctx, true, pgxlockmigrate.Config{})
	app := pgtest.Config(t).ConnConfig.RuntimeParams["application_name"]
	type child struct {
		cmd *exec.Cmd
		out *bytes.Buffer
	}
	var cs []child
	for i := range 4 {
		cmd, out := startHelper(t, ctx, helperSpec{DSN: pgtest.DSN(t), App: fmt.Sprintf("%s-c%d", app, i),
			Schema: f.schema, N: 4, Stock: i%2 == 1})
		cs = append(cs, child{cmd, out})
	}
	for i, c := range cs {
		assert.NoError(t, c.cmd.Wait(), "child %d:\n%s", i, c.out)
	}
	assert.Equal(t, map[int]int{1: 1, 2: 1, 3: 1, 4: 1}, f.counts(t))
}

// kill -9 of the process that holds the lock mid-migration: PostgreSQL
// releases the lock with the session, the next Up gets it at once and
// reports golang-migrate's dirty version (the killed migration was rolled
// back) rather than waiting or timing out.
func TestKilledHolderReleasesTheLock(t *testing.T) {
	ctx := testCtx(t)
	gate := pgtest.UniqueInt64(t)
	f := newFixture(t, 3, gate)
	next := f.replica(t, ctx, false, pgxlockmigrate.Config{LockTimeout: 30 * time.Second})

	f.holdGate(t, ctx) // held past the kill: the child never finishes migration 2

	app := pgtest.Config(t).ConnConfig.RuntimeParams["application_name"] + "-holder"
	cmd, out := startHelper(t, ctx, helperSpec{DSN: pgtest.DSN(t), App: app, Schema: f.schema, N: 3, Gate: gate})
	// The child holds the migration lock and its migration 2 waits for the gate.
	awaitApp(t, ctx, f.check, app, next.d.Key(), true)
	awaitApp(t, ctx, f.check, app, keys.Key{}, false)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	werr := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, werr, &exit, "child output:\n%s", out)

	err := next.m.Up()
	var dirty migrate.ErrDirty
	require.ErrorAs(t, err, &dirty)
	assert.Equal(t, 2, dirty.Version)
	assert.Equal(t, map[int]int{1: 1}, f.counts(t))
}

// awaitApp waits until a backend named app holds (granted) or awaits (not
// granted) an advisory lock; k, when not zero, is the bigint key it must be.
func awaitApp(t *testing.T, ctx context.Context, check *pgxpool.Pool, app string, k keys.Key, granted bool) {
	t.Helper()
	for {
		locks, err := pgtest.AdvisoryLocks(ctx, check, app)
		require.NoError(t, err)
		for _, l := range locks {
			if l.Granted == granted && (k.IsZero() || l.Key() == bigint(k)) {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %s never came to that lock state; locks: %v", app, locks)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
