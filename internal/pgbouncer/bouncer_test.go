package pgbouncer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// start fails the test when PgBouncer cannot start; it skips it when the binary is not
// installed (pgtest.MissingTool: a failure under PGXLOCK_TEST_STRICT=1, as in CI).
func start(t *testing.T, opts Options) *Bouncer {
	t.Helper()
	needBinary(t)
	b, err := Start(testCtx(t), opts)
	require.NoError(t, err, "start PgBouncer")
	t.Cleanup(func() { assert.NoError(t, b.Stop()) })
	return b
}

// needBinary ends the test through pgtest.MissingTool when pgbouncer is not installed.
func needBinary(t *testing.T) {
	t.Helper()
	if _, err := findBinary(""); err != nil {
		pgtest.MissingTool(t, "PgBouncer", err)
	}
}

func TestStartTransactionMode(t *testing.T) {
	ctx := testCtx(t)
	b := start(t, Options{Upstream: pgtest.DSN(t)})
	t.Logf("%s on port %d: %s", b.Version(), b.Port(), b.DSN())
	assert.True(t, strings.HasPrefix(b.Version(), "PgBouncer "), b.Version())

	cfg, err := pgx.ParseConfig(b.DSN())
	require.NoError(t, err)
	// PgBouncer 1.18 in transaction mode cannot keep named prepared statements.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)

	// PgBouncer announces a backend PID of its own: the proxy signature.
	var pid uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	assert.NotEqual(t, conn.PgConn().PID(), pid)

	// The pool mode is what was asked for (admin console, simple protocol).
	admin, err := pgconn.Connect(ctx, strings.Replace(b.DSN(), "/"+b.db+"?", "/pgbouncer?", 1))
	require.NoError(t, err)
	defer admin.Close(ctx)
	res, err := admin.Exec(ctx, "SHOW CONFIG").ReadAll()
	require.NoError(t, err)
	mode := ""
	for _, row := range res[0].Rows {
		if string(row[0]) == "pool_mode" {
			mode = string(row[1])
		}
	}
	assert.Equal(t, "transaction", mode)
}

func TestStopLeavesNothing(t *testing.T) {
	needBinary(t)
	ctx := testCtx(t)
	b, err := Start(ctx, Options{Upstream: pgtest.DSN(t), PoolMode: PoolSession})
	require.NoError(t, err)
	pid := b.cmd.Process.Pid
	conn, err := pgconn.Connect(ctx, b.DSN())
	require.NoError(t, err)
	defer conn.Close(ctx)

	require.NoError(t, b.Stop())
	require.NoError(t, b.Stop(), "Stop is idempotent")
	_, err = os.Stat(b.dir)
	assert.True(t, errors.Is(err, os.ErrNotExist), "directory %s still there: %v", b.dir, err)
	assert.False(t, processAlive(pid), "pgbouncer %d still running", pid)
	// The client connection through it is gone too.
	_, err = conn.Exec(ctx, "SELECT 1").ReadAll()
	assert.Error(t, err)
	_, err = pgconn.Connect(ctx, b.DSN())
	assert.Error(t, err, "still accepting connections after Stop")
}

func TestMissingBinary(t *testing.T) {
	_, err := Start(testCtx(t), Options{Upstream: "postgres://u@127.0.0.1:1/db", Binary: "/nonexistent/pgbouncer"})
	require.ErrorIs(t, err, ErrNoBinary)
	assert.Contains(t, err.Error(), "run: bash .ci/setup")
}

// A bouncer whose upstream does not answer is reported by Start, with PgBouncer's log,
// and nothing is left running.
func TestBadUpstream(t *testing.T) {
	needBinary(t)
	port, err := freePort() // nothing listens there
	require.NoError(t, err)
	before := ownDirs()
	_, err = Start(testCtx(t), Options{Upstream: "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres"})
	require.Error(t, err)
	t.Log(err)
	assert.Contains(t, err.Error(), "pgbouncer log")
	assert.ElementsMatch(t, before, ownDirs(), "a failed Start left a directory behind")
}

// ownDirs lists the bouncer directories this process owns (other test binaries may be
// creating theirs meanwhile).
func ownDirs() []string {
	var own []string
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		if pid, ok := readPID(filepath.Join(d, ownerFile)); ok && pid == os.Getpid() {
			own = append(own, d)
		}
	}
	return own
}

func TestOptionsRefused(t *testing.T) {
	ctx := testCtx(t)
	_, err := Start(ctx, Options{Upstream: "postgres://u@h/db", PoolMode: "bogus"})
	assert.ErrorContains(t, err, "unknown pool mode")
	_, err = Start(ctx, Options{Upstream: "postgres://u@h/db", Settings: map[string]string{"listen_port": "1"}})
	assert.ErrorContains(t, err, "chosen by Start")
}

func TestIniFile(t *testing.T) {
	up, err := pgconn.ParseConfig("host=/var/run/postgresql port=5433 user=o'neil password='p w' dbname=app")
	require.NoError(t, err)
	ini := string(iniFile("/d", 6432, PoolTransaction, 3, up, map[string]string{"server_round_robin": "1"}))
	for _, want := range []string{
		`* = host='/var/run/postgresql' port=5433 user='o\'neil' password='p w'`,
		"listen_addr = 127.0.0.1\n", "listen_port = 6432\n", "auth_type = trust\n",
		"pool_mode = transaction\n", "default_pool_size = 3\n", "auth_file = /d/userlist.txt\n",
		"server_round_robin = 1\n",
	} {
		assert.Contains(t, ini, want)
	}
	assert.Equal(t, `"a""b" ""`+"\n", string(userlist(`a"b`)))
}
