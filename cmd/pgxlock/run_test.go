package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// gateScript appends "start $1" to $LOG, waits (bounded: 30 s) until the file
// $GATE exists, then appends "end $1". A held lock keeps the next holder's
// "start" out until the gate opens.
const gateScript = `echo "start $1" >> "$LOG"
i=0
while [ ! -e "$GATE" ]; do
  i=$((i+1)); [ $i -gt 3000 ] && exit 99
  sleep 0.01
done
echo "end $1" >> "$LOG"`

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return ""
	}
	require.NoError(t, err)
	return string(b)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Two `run` invocations on one key never overlap: the second waits in
// pg_locks while the first's command runs, and starts only after it ended.
func TestRunTwoInvocationsNeverOverlap(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	dir := t.TempDir()
	log, gate := filepath.Join(dir, "log"), filepath.Join(dir, "gate")
	env := []string{"LOG=" + log, "GATE=" + gate}

	a := startCLI(t, "", env, "run", "--key", key.String(), "--", "sh", "-c", gateScript, "sh", "A")
	waitFor(t, waitTimeout, "A's command to start", func() bool { return readFile(t, log) == "start A\n" })
	holder := waitCLI(t, pool, key, true)

	b := startCLI(t, "", env, "run", "--key", key.String(), "--", "sh", "-c", gateScript, "sh", "B")
	waiter := waitCLI(t, pool, key, false)
	assert.NotEqual(t, holder, waiter)
	assert.Equal(t, "start A\n", readFile(t, log), "B's command must not start while A holds the lock")
	assert.False(t, b.exited())

	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	assert.Equal(t, 0, a.wait(), "A stderr: %s", a.stderr)
	assert.Equal(t, 0, b.wait(), "B stderr: %s", b.stderr)
	assert.Equal(t, "start A\nend A\nstart B\nend B\n", readFile(t, log))
	waitNoCLI(t, pool, key)
}

// Several concurrent invocations on one key: every command's start/end pair
// is contiguous in the shared log.
func TestRunManyInvocationsNeverInterleave(t *testing.T) {
	pool := pgtest.Pool(t)
	src := "pgxlock-cli-test-" + strconv.FormatUint(uint64(pgtest.UniqueInt64(t)), 16)
	key := keys.Hash(src) // what --key src means
	log := filepath.Join(t.TempDir(), "log")
	const n = 5
	// The sleep is the critical section's work, giving an overlap a chance
	// to show; nothing waits on it.
	script := `echo "start $1" >> "$LOG"; sleep 0.05; echo "end $1" >> "$LOG"`
	var ps []*proc
	for i := range n {
		ps = append(ps, startCLI(t, "", []string{"LOG=" + log}, "run", "--key", src, "--", "sh", "-c", script, "sh", strconv.Itoa(i)))
	}
	for _, p := range ps {
		require.Equal(t, 0, p.wait(), "stderr: %s", p.stderr)
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, log)), "\n")
	require.Len(t, lines, 2*n)
	seen := map[string]bool{}
	for i := 0; i < len(lines); i += 2 {
		id, ok := strings.CutPrefix(lines[i], "start ")
		require.True(t, ok, "line %d: %q", i, lines[i])
		assert.Equal(t, "end "+id, lines[i+1], "lines %d-%d interleave: %q", i, i+1, lines)
		assert.False(t, seen[id])
		seen[id] = true
	}
	waitNoCLI(t, pool, key)
}

func TestRunTryWhileHeldExits75(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	pid := hold(t, pool, key)
	ran := filepath.Join(t.TempDir(), "ran")

	code, _, stderr := runCLI(t, nil, "run", "--key", key.String(), "--try", "--", "touch", ran)
	assert.Equal(t, exitBusy, code, stderr)
	assert.Contains(t, stderr, "busy")
	assert.Contains(t, stderr, "pid "+strconv.Itoa(int(pid)), "the message names the holder")
	assert.False(t, fileExists(ran), "the command must not run")
	waitNoCLI(t, pool, key)
}

func TestRunWaitTimesOutExits124(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Pair(pgtest.UniqueInt32(t), 7)
	hold(t, pool, key)
	ran := filepath.Join(t.TempDir(), "ran")

	start := time.Now()
	code, _, stderr := runCLI(t, nil, "run", "--key", strings.TrimPrefix(key.String(), "pair:"), "--wait", "200ms", "--", "touch", ran)
	assert.Equal(t, exitTimeout, code, stderr)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	assert.Contains(t, stderr, "timed out")
	assert.False(t, fileExists(ran), "the command must not run")
	waitNoCLI(t, pool, key)
}

// --shared holders run together; an exclusive --try meanwhile is busy.
func TestRunSharedHoldersOverlap(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	dir := t.TempDir()
	log, gate := filepath.Join(dir, "log"), filepath.Join(dir, "gate")
	env := []string{"LOG=" + log, "GATE=" + gate}

	a := startCLI(t, "", env, "run", "--key", key.String(), "--shared", "--", "sh", "-c", gateScript, "sh", "A")
	waitFor(t, waitTimeout, "A's command to start", func() bool { return readFile(t, log) == "start A\n" })

	code, _, stderr := runCLI(t, env, "run", "--key", key.String(), "--shared", "--try", "--", "sh", "-c", `echo "shared B" >> "$LOG"`)
	assert.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, env, "run", "--key", key.String(), "--try", "--", "sh", "-c", `echo "exclusive C" >> "$LOG"`)
	assert.Equal(t, exitBusy, code, stderr)

	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	assert.Equal(t, 0, a.wait(), a.stderr.String())
	assert.Equal(t, "start A\nshared B\nend A\n", readFile(t, log))
	waitNoCLI(t, pool, key)
}

func TestRunPropagatesExitStatus(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"success", []string{"true"}, 0},
		{"failure", []string{"false"}, 1},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 3},
		{"exit 75 from the command", []string{"sh", "-c", "exit 75"}, 75},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{"not found", []string{"pgxlock-test-no-such-command"}, exitNotFound},
		{"not executable", []string{"/dev/null"}, exitCannotExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--key", key.String(), "--"}, tc.argv...)
			code, _, stderr := runCLI(t, nil, args...)
			assert.Equal(t, tc.want, code, stderr)
		})
	}
	waitNoCLI(t, pool, key)
}

// stdin, stdout and stderr are the command's.
func TestRunPassesStdio(t *testing.T) {
	key := keys.Int64(pgtest.UniqueInt64(t))
	p := startCLI(t, "hello through the lock\n", nil, "run", "--key", key.String(), "--", "sh", "-c", "cat; echo oops >&2")
	require.Equal(t, 0, p.wait(), p.stderr.String())
	assert.Equal(t, "hello through the lock\n", p.stdout.String())
	assert.Equal(t, "oops\n", p.stderr.String())
}

// trapScript records which of TERM, INT, HUP it got in $OUT and exits 42;
// it writes $READY once its traps are set.
const trapScript = `trap 'echo TERM > "$OUT"; exit 42' TERM
trap 'echo INT > "$OUT"; exit 42' INT
trap 'echo HUP > "$OUT"; exit 42' HUP
echo ready > "$READY"
i=0
while :; do i=$((i+1)); [ $i -gt 3000 ] && exit 99; sleep 0.01; done`

// SIGTERM, SIGINT and SIGHUP sent to pgxlock reach the command; pgxlock exits
// with the command's status and releases the lock.
func TestRunForwardsSignals(t *testing.T) {
	pool := pgtest.Pool(t)
	for sig, name := range map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP"} {
		t.Run(name, func(t *testing.T) {
			key := keys.Int64(pgtest.UniqueInt64(t))
			dir := t.TempDir()
			out, ready := filepath.Join(dir, "out"), filepath.Join(dir, "ready")
			p := startCLI(t, "", []string{"OUT=" + out, "READY=" + ready}, "run", "--key", key.String(), "--", "sh", "-c", trapScript)
			waitFor(t, waitTimeout, "the command to be ready", func() bool { return fileExists(ready) })
			p.signal(sig)
			assert.Equal(t, 42, p.wait(), p.stderr.String())
			assert.Equal(t, name+"\n", readFile(t, out))
			waitNoCLI(t, pool, key)
		})
	}
}

// A signal while waiting for the lock abandons the wait: exit 128+N, the
// command never runs, no wait is left in pg_locks.
func TestRunSignalWhileWaiting(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	hold(t, pool, key)
	ran := filepath.Join(t.TempDir(), "ran")
	p := startCLI(t, "", nil, "run", "--key", key.String(), "--", "touch", ran)
	waitCLI(t, pool, key, false)
	p.signal(syscall.SIGTERM)
	assert.Equal(t, 128+int(syscall.SIGTERM), p.wait(), p.stderr.String())
	assert.Contains(t, p.stderr.String(), "the command was not run")
	assert.False(t, fileExists(ran))
	waitNoCLI(t, pool, key)
}

// When the backend holding the lock is terminated, the command gets SIGTERM
// and pgxlock exits 70, whatever the command's own status; -v never says the
// lost lock was "released".
func TestRunLockLostTerminatesCommand(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "out"), filepath.Join(dir, "ready")
	// The command exits 0 on TERM: 70 must come from pgxlock.
	script := strings.ReplaceAll(trapScript, "exit 42", "exit 0")
	p := startCLI(t, "", []string{"OUT=" + out, "READY=" + ready}, "run", "-v", "--key", key.String(), "--", "sh", "-c", script)
	waitFor(t, waitTimeout, "the command to be ready", func() bool { return fileExists(ready) })
	pid := waitCLI(t, pool, key, true)

	var ok bool
	require.NoError(t, pool.QueryRow(ctxT(t), "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
	assert.Equal(t, exitLockLost, p.wait(), p.stderr.String())
	assert.Equal(t, "TERM\n", readFile(t, out), "the command must get SIGTERM")
	assert.Contains(t, p.stderr.String(), "lost")
	assert.Contains(t, p.stderr.String(), "acquired", "-v reports the acquisition")
	assert.NotContains(t, p.stderr.String(), "released", "a lost lock is not released")
}

// A command that ignores SIGTERM after a loss is killed after --grace.
func TestRunLockLostKillsAfterGrace(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	ready := filepath.Join(t.TempDir(), "ready")
	script := `trap '' TERM; echo ready > "$READY"; i=0; while :; do i=$((i+1)); [ $i -gt 3000 ] && exit 99; sleep 0.01; done`
	p := startCLI(t, "", []string{"READY=" + ready}, "run", "--key", key.String(), "--grace", "100ms", "--", "sh", "-c", script)
	waitFor(t, waitTimeout, "the command to be ready", func() bool { return fileExists(ready) })
	pid := waitCLI(t, pool, key, true)

	_, err := pool.Exec(ctxT(t), "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	assert.Equal(t, exitLockLost, p.wait(), p.stderr.String())
	assert.Contains(t, p.stderr.String(), "SIGKILL")
}

// pgxlock killed with SIGKILL while waiting leaves no waiter behind: the
// server notices the dead client (client_connection_check_interval) instead
// of waiting on, and getting, the lock for nobody.
func TestRunKilledWhileWaitingLeavesNoWaiter(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	hold(t, pool, key)
	p := startCLI(t, "", nil, "run", "--key", key.String(), "--", "true")
	waitCLI(t, pool, key, false)
	p.signal(syscall.SIGKILL)
	p.wait()
	waitNoCLI(t, pool, key)
}

// pgxlock killed with SIGKILL while the command runs: the session ends, so
// the lock is released, and the command is killed too (Linux: parent-death
// signal), so it never runs unprotected.
func TestRunKilledWhileHoldingKillsCommand(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `echo $$ > "$PIDFILE.tmp"; mv "$PIDFILE.tmp" "$PIDFILE"; i=0; while :; do i=$((i+1)); [ $i -gt 3000 ] && exit 99; sleep 0.01; done`
	p := startCLI(t, "", []string{"PIDFILE=" + pidFile}, "run", "--key", key.String(), "--", "sh", "-c", script)
	waitFor(t, waitTimeout, "the command to start", func() bool { return fileExists(pidFile) })
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pidFile)))
	require.NoError(t, err)
	waitCLI(t, pool, key, true)

	p.signal(syscall.SIGKILL)
	p.wait()
	waitFor(t, waitTimeout, "the command to die", func() bool { return !processAlive(pid) })
	waitNoCLI(t, pool, key)
}

// processAlive reports whether pid is a live process (not gone, not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) STATE ...; comm may hold spaces, so look after the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// --heartbeat: a holding backend that stops answering (frozen with SIGSTOP,
// as a hung server or a silent partition would look) is noticed by a ping
// that times out; the command gets SIGTERM and pgxlock exits 70. It needs a
// private local cluster, to be allowed to stop one of its processes.
func TestRunHeartbeatNoticesFrozenBackend(t *testing.T) {
	c := pgtest.Cluster(t)
	cfg, err := pgxpool.ParseConfig(c.DSN())
	require.NoError(t, err)
	pool := pgtest.NewPool(t, cfg)
	key := keys.Int64(pgtest.UniqueInt64(t))
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "out"), filepath.Join(dir, "ready")
	script := strings.ReplaceAll(trapScript, "exit 42", "exit 0")
	p := startCLI(t, "", []string{"DATABASE_URL=" + c.DSN(), "OUT=" + out, "READY=" + ready},
		"run", "--key", key.String(), "--heartbeat", "100ms", "--", "sh", "-c", script)
	waitFor(t, waitTimeout, "the command to be ready", func() bool { return fileExists(ready) })
	pid := int(waitCLI(t, pool, key, true))

	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	assert.Equal(t, exitLockLost, p.wait(), p.stderr.String())
	assert.Equal(t, "TERM\n", readFile(t, out))
	assert.Contains(t, p.stderr.String(), "lost")
}

// stuckPipe returns the write end of a pipe whose buffer is full and which
// nobody reads until the test ends: a write to it blocks.
func stuckPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close(); _ = r.Close() })
	fd := int(w.Fd())
	require.NoError(t, syscall.SetNonblock(fd, true))
	chunk := make([]byte, 4096)
	for {
		if _, err := syscall.Write(fd, chunk); err != nil {
			require.ErrorIs(t, err, syscall.EAGAIN)
			break
		}
	}
	require.NoError(t, syscall.SetNonblock(fd, false))
	return w
}

// With a stderr nobody reads (review 31j), a lost lock still sends the
// command SIGTERM and pgxlock still exits 70: its own messages go through a
// queue that a stuck stream cannot hold back (the "lost" message blocked
// the loop that sends the signal, and the command ran on without the lock).
func TestRunLockLostWithAStuckStderr(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "out"), filepath.Join(dir, "ready")
	// The command's own stderr is elsewhere: sh reports its sleep's SIGTERM
	// there ("Terminated"), and would block on the stuck pipe itself.
	script := "exec 2>/dev/null\n" + strings.ReplaceAll(trapScript, "exit 42", "exit 0")
	p := startCLIOn(t, "", stuckPipe(t), []string{"OUT=" + out, "READY=" + ready}, "run", "-v", "--key", key.String(), "--", "sh", "-c", script)
	waitFor(t, waitTimeout, "the command to be ready", func() bool { return fileExists(ready) })
	pid := waitCLI(t, pool, key, true)
	var ok bool
	require.NoError(t, pool.QueryRow(ctxT(t), "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
	waitFor(t, waitTimeout, "the command to get SIGTERM", func() bool { return fileExists(out) })
	assert.Equal(t, "TERM\n", readFile(t, out))
	assert.Equal(t, exitLockLost, p.wait())
}

// A stderr whose reader has gone (`2>&1 | head -1`) does not change run's
// status (review 31j: SIGPIPE ended pgxlock with 141): the command's 0.
func TestRunWithAClosedStderrKeepsTheCommandsStatus(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, r.Close())
	t.Cleanup(func() { _ = w.Close() })
	key := keys.Int64(pgtest.UniqueInt64(t))
	p := startCLIOn(t, "", w, nil, "run", "-v", "--key", key.String(), "--", "true")
	assert.Equal(t, 0, p.wait())
}
