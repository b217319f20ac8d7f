package pglaunch

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts a cluster and stops it at cleanup. Unless opts says otherwise it uses the
// user's template cache, as callers of Start do.
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard: initdb under -race on a loaded 2-core machine is slow
	defer cancel()
	c, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Stop(ctx))
	})
	return c
}

func queryString(t *testing.T, dsn, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s string
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&s))
	return s
}

func TestFindBinDir(t *testing.T) {
	dir, err := FindBinDir()
	require.NoError(t, err, "these tests need PostgreSQL server binaries, e.g. apt-get install postgresql")
	assert.True(t, hasServerBinaries(dir), dir)
}

func TestNewestVersionDir(t *testing.T) {
	root := t.TempDir()
	mk := func(ver string, withBinaries bool) {
		bin := filepath.Join(root, ver, "bin")
		require.NoError(t, os.MkdirAll(bin, 0o755))
		if withBinaries {
			for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
				require.NoError(t, os.WriteFile(filepath.Join(bin, name), nil, 0o755))
			}
		}
	}
	mk("9.6", true)
	mk("10", true)
	mk("15", true)
	mk("16", false) // client-only: skipped
	dir, ok := newestVersionDir(filepath.Join(root, "*", "bin"))
	require.True(t, ok)
	assert.Equal(t, filepath.Join(root, "15", "bin"), dir)

	_, ok = newestVersionDir(filepath.Join(root, "none-*", "bin"))
	assert.False(t, ok)
}

func TestFindBinDirErrorNamesPlaces(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no pg_config, no initdb
	defer func(d, r string) { debianBinGlob, rhelBinGlob = d, r }(debianBinGlob, rhelBinGlob)
	debianBinGlob = filepath.Join(t.TempDir(), "*", "bin")
	rhelBinGlob = filepath.Join(t.TempDir(), "pgsql-*", "bin")

	_, err := FindBinDir()
	require.ErrorIs(t, err, ErrNoBinaries)
	for _, want := range []string{"pg_config --bindir", debianBinGlob, "initdb on $PATH", rhelBinGlob} {
		assert.Contains(t, err.Error(), want)
	}
}

// The throwaway path end to end: start, query, restart on the same port, query, stop,
// nothing left.
func TestStartRestartStop(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	c := start(t, Options{Log: &log, Settings: map[string]string{"deadlock_timeout": "250ms"}})

	assert.Equal(t, "postgres://postgres@127.0.0.1:"+strconv.Itoa(c.Port())+"/postgres?sslmode=disable", c.DSN())
	assert.Equal(t, "off", queryString(t, c.DSN(), "SHOW fsync"))
	assert.Equal(t, "off", queryString(t, c.DSN(), "SHOW synchronous_commit"))
	assert.Equal(t, "off", queryString(t, c.DSN(), "SHOW full_page_writes"))
	assert.Equal(t, "200", queryString(t, c.DSN(), "SHOW max_connections"))
	assert.Equal(t, "250ms", queryString(t, c.DSN(), "SHOW deadlock_timeout"))
	assert.Equal(t, "UTF8", queryString(t, c.DSN(), "SHOW server_encoding"))
	assert.Equal(t, "C", queryString(t, c.DSN(), "SHOW lc_collate"))
	assert.Equal(t, filepath.Dir(c.DataDir()), queryString(t, c.DSN(), "SHOW unix_socket_directories"))

	pid, ok := postmasterPID(c.DataDir())
	require.True(t, ok)
	port := c.Port()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard: initdb under -race on a loaded 2-core machine is slow
	defer cancel()
	require.NoError(t, c.Restart(ctx))
	assert.Equal(t, port, c.Port())
	assert.Equal(t, "250ms", queryString(t, c.DSN(), "SHOW deadlock_timeout"))
	newPID, ok := postmasterPID(c.DataDir())
	require.True(t, ok)
	assert.NotEqual(t, pid, newPID, "restart must start a new postmaster")

	require.NoError(t, c.Stop(ctx))
	assert.NoDirExists(t, filepath.Dir(c.DataDir()))
	assert.False(t, processAlive(newPID), "postmaster still running after Stop")
	assert.NoError(t, c.Stop(ctx), "Stop is idempotent")
	assert.ErrorIs(t, c.Restart(ctx), ErrStopped)
	assert.Contains(t, log.String(), "server log of port")
	t.Log(log.String())
}

func TestTemplateCache(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	var log1, log2 syncBuffer
	t0 := time.Now()
	c1 := start(t, Options{CacheDir: cache, Log: &log1})
	d1 := time.Since(t0)
	assert.Contains(t, log1.String(), ": initdb ")
	assert.Contains(t, log1.String(), "cached template data directory")

	t0 = time.Now()
	c2 := start(t, Options{CacheDir: cache, Log: &log2})
	d2 := time.Since(t0)
	assert.Contains(t, log2.String(), ": template copy ")
	assert.Equal(t, "1", queryString(t, c2.DSN(), "SELECT 1::text"))
	assert.NotEqual(t, c1.Port(), c2.Port())
	t.Logf("first start (initdb + cache) %v, second start (template copy) %v", d1, d2)

	// Nothing but the entry stays in the cache directory.
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.NotContains(t, entries[0].Name(), "tmp-")
}

func TestNoTemplateCache(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	c := start(t, Options{NoTemplateCache: true, Log: &log})
	assert.Contains(t, log.String(), ": initdb ")
	assert.NotContains(t, log.String(), "cached template")
	assert.Equal(t, "1", queryString(t, c.DSN(), "SELECT 1::text"))
}

// A damaged cache entry must not break starts: it is discarded and initdb runs.
func TestCorruptTemplateFallsBackToInitdb(t *testing.T) {
	t.Parallel()
	// Seed a private cache from the user's (populated by this first start), which is
	// cheaper than another initdb.
	c := start(t, Options{})
	shared := newTemplateCache(Options{}, c.binDir)
	require.NotNil(t, shared)
	cache := t.TempDir()
	private := newTemplateCache(Options{CacheDir: cache}, c.binDir)
	entry := private.entry
	require.NoError(t, copyTree(shared.entry, entry, nil, false))

	// Bad settings are not the template's fault: the entry survives a failed start.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard: initdb under -race on a loaded 2-core machine is slow
	defer cancel()
	_, err := Start(ctx, Options{CacheDir: cache, Settings: map[string]string{"max_connections": "-1"}})
	require.Error(t, err)
	assert.DirExists(t, entry)

	require.NoError(t, os.WriteFile(filepath.Join(entry, "global", "pg_control"), []byte("garbage"), 0o600))

	var log syncBuffer
	c = start(t, Options{CacheDir: cache, Log: &log})
	assert.Contains(t, log.String(), "start from cached template failed")
	assert.Contains(t, log.String(), "discarded damaged template cache entry")
	assert.Equal(t, "1", queryString(t, c.DSN(), "SELECT 1::text"))
	assert.NoDirExists(t, entry)
}

// A port taken between pick and start is retried with another.
func TestPortClashRetries(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	orig := pickPort
	defer func() { pickPort = orig }()
	calls := 0
	pickPort = func() (int, error) {
		calls++
		if calls == 1 {
			return taken, nil
		}
		return orig()
	}

	var log syncBuffer
	c := start(t, Options{Log: &log})
	assert.NotEqual(t, taken, c.Port())
	assert.Equal(t, 2, calls)
	assert.Contains(t, log.String(), "port "+strconv.Itoa(taken)+" taken")
}

// A failed start returns pg_ctl's output and the server log, and leaves nothing behind.
func TestStartFailureCarriesOutputAndCleansUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard: initdb under -race on a loaded 2-core machine is slow
	defer cancel()
	_, err := Start(ctx, Options{NoTemplateCache: true, Settings: map[string]string{"shared_buffers": "not-a-size"}})
	require.Error(t, err)
	var ce *CommandError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "pg_ctl start")
	assert.Contains(t, err.Error(), "shared_buffers", "server log tail in the error")
	m := regexp.MustCompile(`server log \((\S+)/server\.log`).FindStringSubmatch(err.Error())
	require.Len(t, m, 2, "error names the server log")
	assert.NoDirExists(t, m[1], "temporary directory left behind")
}

func TestSettingsRejected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []map[string]string{
		{"port": "5432"},
		{"Listen_Addresses": "*"},
		{"unix_socket_directories": "/tmp"},
		{"bad name": "1"},
		{"x = 1\nfsync": "on"},
		{"work_mem": "4MB'\nfsync = 'on"},
	} {
		_, err := Start(ctx, Options{Settings: s})
		assert.Error(t, err, "%v", s)
	}
}

func TestQuoteConf(t *testing.T) {
	assert.Equal(t, `'a''b\\c'`, quoteConf(`a'b\c`))
}

// A cluster whose owner process died is stopped and removed by the next Start's sweep.
// Not parallel: every Start sweeps, and another one could reap this orphan first.
func TestReapOrphans(t *testing.T) {
	c := start(t, Options{})
	pid, ok := postmasterPID(c.DataDir())
	require.True(t, ok)

	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(c.DataDir()), ownerFile),
		[]byte(strconv.Itoa(dead.Process.Pid)+"\n"), 0o644))

	var log syncBuffer
	r, err := newRunner("", &log)
	require.NoError(t, err)
	reapOrphans(r)
	assert.NoDirExists(t, filepath.Dir(c.DataDir()))
	assert.False(t, processAlive(pid), "orphan postmaster still running")
}

// Stop with an already-cancelled context still takes the server down.
func TestStopWithCancelledContext(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	pid, ok := postmasterPID(c.DataDir())
	require.True(t, ok)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.Stop(ctx)
	assert.NoError(t, err)
	assert.False(t, processAlive(pid))
	assert.NoDirExists(t, filepath.Dir(c.DataDir()))
}

func TestCommandErrorUnwraps(t *testing.T) {
	inner := errors.New("exit status 1")
	err := error(&CommandError{Args: []string{"initdb", "-D", "x"}, Output: "boom\n", Err: inner})
	assert.ErrorIs(t, err, inner)
	assert.True(t, strings.HasPrefix(err.Error(), "pglaunch: initdb -D x: exit status 1\nboom"))
}

// BenchmarkStartStop measures a throwaway cluster's life: start (initdb or template copy,
// then pg_ctl start) and Stop.
func BenchmarkStartStop(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"template", Options{}},
		{"initdb", Options{NoTemplateCache: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var startTotal time.Duration
			for range b.N {
				t0 := time.Now()
				c, err := Start(ctx, bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				startTotal += time.Since(t0)
				if err := c.Stop(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(startTotal.Seconds()/float64(b.N), "s-start/op")
		})
	}
}
