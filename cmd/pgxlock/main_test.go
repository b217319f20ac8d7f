package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// envBeCLI makes the test binary act as pgxlock itself. The tests drive that
// built binary as separate processes: it is the same main package, compiled
// once by `go test` (with -race when the tests run with it, so the CLI's own
// goroutines are race-checked too), and nothing is left behind in a temporary
// directory or needs a Go toolchain at run time.
const envBeCLI = "PGXLOCK_TEST_BE_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(envBeCLI) == "1" {
		main() // exits
	}
	pgtest.Main(m)
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
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

// proc is one pgxlock process started by a test.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	code           int
}

// procTimeout bounds every pgxlock process of the tests.
const procTimeout = 60 * time.Second

// startCLI starts pgxlock with args against the test database (or the
// DATABASE_URL in extraEnv), with extra environment entries (NAME=value) for
// pgxlock and the command it runs.
// A process still running at the end of the test is killed.
func startCLI(t *testing.T, stdin string, extraEnv []string, args ...string) *proc {
	t.Helper()
	return startCLIOn(t, stdin, nil, extraEnv, args...)
}

// startCLIOn is startCLI with stderr going to the given stream (nil: a
// buffer the test reads, p.stderr).
func startCLIOn(t *testing.T, stdin string, stderr io.Writer, extraEnv []string, args ...string) *proc {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	dsn := ""
	for _, kv := range extraEnv {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			dsn = v
		}
	}
	if dsn == "" {
		dsn = pgtest.DSN(t)
	}
	cmd.Env = append(os.Environ(), envBeCLI+"=1", "DATABASE_URL="+dsn,
		// Under -race the runtime sleeps 1 s at exit to catch late reports;
		// races are still reported (and the exit status is 66) without it.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, extraEnv...)
	p := &proc{t: t, cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if stderr != nil {
		cmd.Stderr = stderr
	}
	require.NoError(t, cmd.Start())
	go func() {
		defer close(p.done)
		err := cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Errorf("pgxlock %v: %v", args, err)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits (bounded) for the process to exit and returns its status.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(procTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("pgxlock %v did not exit within %s\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], procTimeout, p.stdout, p.stderr)
	}
	return p.code
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// runCLI runs pgxlock to completion and returns its status and output.
func runCLI(t *testing.T, extraEnv []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startCLI(t, "", extraEnv, args...)
	code = p.wait()
	return code, p.stdout.String(), p.stderr.String()
}

// waitFor polls cond every 10 ms until it is true, failing the test after
// timeout. It is the only way the tests wait for another process.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitTimeout bounds waits for database states and files.
const waitTimeout = 30 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// cliLocks returns the pg_locks rows on key of backends of the CLI.
func cliLocks(t *testing.T, pool *pgxpool.Pool, key keys.Key) []advisory.LockInfo {
	t.Helper()
	all, err := advisory.ListLocks(ctxT(t), pool, key)
	require.NoError(t, err)
	var out []advisory.LockInfo
	for _, li := range all {
		if li.ApplicationName == appName {
			out = append(out, li)
		}
	}
	return out
}

// waitCLI waits until a CLI backend holds (granted) or awaits key, and
// returns its pid.
func waitCLI(t *testing.T, pool *pgxpool.Pool, key keys.Key, granted bool) int32 {
	t.Helper()
	var pid int32
	state := map[bool]string{true: "hold", false: "wait for"}[granted]
	waitFor(t, waitTimeout, "a pgxlock backend to "+state+" "+key.String(), func() bool {
		for _, li := range cliLocks(t, pool, key) {
			if li.Granted == granted {
				pid = li.PID
				return true
			}
		}
		return false
	})
	return pid
}

// waitNoCLI waits until no CLI backend holds or awaits key.
func waitNoCLI(t *testing.T, pool *pgxpool.Pool, key keys.Key) {
	t.Helper()
	waitFor(t, waitTimeout, "pgxlock backends to let go of "+key.String(), func() bool {
		return len(cliLocks(t, pool, key)) == 0
	})
}

// hold takes key at session level on a connection pinned from pool and
// returns that backend's pid. The lock is released at cleanup.
func hold(t *testing.T, pool *pgxpool.Pool, key keys.Key) int32 {
	t.Helper()
	conn, err := pool.Acquire(ctxT(t))
	require.NoError(t, err)
	var pid int32
	require.NoError(t, conn.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&pid))
	_, err = conn.Exec(ctxT(t), lockSQL(key, "pg_advisory_lock"))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
			_ = conn.Conn().Close(ctx) // a closed connection is dropped by Release
		}
		conn.Release()
	})
	return pid
}

// lockSQL returns "SELECT fn(args)" for key, with the key's numbers inline.
func lockSQL(key keys.Key, fn string) string {
	if v, ok := key.Int64(); ok {
		return "SELECT " + fn + "(" + itoa64(v) + "::bigint)"
	}
	a, b, _ := key.Pair()
	return "SELECT " + fn + "(" + itoa64(int64(a)) + "::int4, " + itoa64(int64(b)) + "::int4)"
}

func itoa64(v int64) string { return strconv.FormatInt(v, 10) }
