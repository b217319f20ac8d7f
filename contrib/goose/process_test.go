package pgxlockgoose_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// helperEnv carries a helperSpec (JSON) to a re-executed test binary.
const helperEnv = "PGXLOCK_GOOSE_TEST_HELPER"

type helperSpec struct {
	DSN    string
	App    string
	Schema string
	Key    int64
}

// TestHelperProcess is not a test: it is the body of the child processes of
// TestProcessesUpOnce, run when helperEnv is set. Run directly it returns.
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
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(spec.Key)})
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(spec.Schema),
		goose.WithTableName(spec.Schema+".goose_db_version"), goose.WithSessionLocker(l))
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)
}

// 4 OS processes run Up at once on the same migrations: each migration is
// applied exactly once and every process exits 0.
func TestProcessesUpOnce(t *testing.T) {
	ctx := testCtx(t)
	schema := migrationDB(t, ctx)
	check := pgtest.Pool(t)
	key := pgtest.UniqueInt64(t)
	// goose's version table exists before the children start (see runUps).
	db, _ := openDB(t, 1)
	_, err := provider(t, db, schema, goose.WithVerbose(false)).GetDBVersion(ctx)
	require.NoError(t, err)
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for i := range 4 {
		raw, err := json.Marshal(helperSpec{DSN: pgtest.DSN(t), App: pgtest.Config(t).ConnConfig.RuntimeParams["application_name"] + "-c" + string(rune('0'+i)),
			Schema: schema, Key: key})
		require.NoError(t, err)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), helperEnv+"="+string(raw), "GORACE="+gorace)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for _, cmd := range cmds {
		require.NoError(t, cmd.Start())
	}
	for i, cmd := range cmds {
		require.NoError(t, cmd.Wait(), "child %d:\n%s", i, outs[i])
	}
	checkAppliedOnce(t, ctx, check, schema)
	var n int
	c, o, s := keys.Int64(key).PgLocks()
	require.NoError(t, check.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1 AND objid = $2 AND objsubid = $3`, c, o, s).Scan(&n))
	require.Zero(t, n, "no advisory lock left on the key")
}
