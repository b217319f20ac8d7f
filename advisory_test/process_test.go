package advisory_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// helperEnv carries a helperSpec (JSON) to a re-executed test binary: it makes
// TestHelperProcess act as one OS process of a process test.
const helperEnv = "PGXLOCK_TEST_HELPER_PROCESS"

// helperSpec tells a child process what to do.
type helperSpec struct {
	DSN        string  // the test database
	App        string  // application_name, by which the parent finds the child's sessions
	Ledger     string  // quoted table name
	Proc       string  // the child's name in the ledger
	Keys       []int64 // the keys
	Goroutines int     // goroutine g runs Iters sections, the i-th on Keys[(g+i) % len(Keys)]
	Iters      int
	StuckAt    int    // goroutine 0 stays inside its StuckAt-th section until killed; -1: never
	History    string // if set, the file the child records its lock history in (JSON lines)
}

// TestHelperProcess is not a test: it is the body of the child processes of the process
// tests, run when helperEnv is set. Run directly, it returns at once.
func TestHelperProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var spec helperSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	// Bounded even if the parent vanishes without killing us; the parent also closes
	// our stdin when it goes, which ends the run at once.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	cfg, err := pgxpool.ParseConfig(spec.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	cfg.MaxConns = int32(spec.Goroutines) + 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)

	var rec *history.Recorder
	if spec.History != "" {
		f, err := os.OpenFile(spec.History, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		require.NoError(t, err)
		defer f.Close()
		rec = history.NewRecorder(spec.Proc, f)
	}

	insert := "INSERT INTO " + spec.Ledger + " (key, proc, g, started_at, stuck) VALUES ($1, $2, $3, clock_timestamp(), $4) RETURNING id"
	update := "UPDATE " + spec.Ledger + " SET ended_at = clock_timestamp() WHERE id = $1"
	section := func(g, i int, key int64) error {
		var a *attempt
		if rec != nil {
			a = beginAttempt(rec, fmt.Sprintf("%s/g%d", spec.Proc, g), []keys.Key{keys.Int64(key)}, false)
		}
		err := l.WithLock(ctx, keys.Int64(key), nil, func(ctx context.Context, conn *pgx.Conn) error {
			a.acquired()
			defer a.releasing()
			stuck := g == 0 && i == spec.StuckAt
			var id int64
			// Entry and exit are separate statements, so the recorded interval lies
			// inside the hold.
			if err := conn.QueryRow(ctx, insert, key, spec.Proc, g, stuck).Scan(&id); err != nil {
				return err
			}
			if stuck {
				<-ctx.Done() // hold until SIGKILL
				return ctx.Err()
			}
			_, err := conn.Exec(ctx, update, id)
			return err
		})
		a.released(err == nil)
		a.failed(history.Unknown)
		return err
	}

	var wg sync.WaitGroup
	errs := make(chan error, spec.Goroutines)
	for g := range spec.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range spec.Iters {
				if err := section(g, i, spec.Keys[(g+i)%len(spec.Keys)]); err != nil {
					errs <- fmt.Errorf("%s goroutine %d section %d: %w", spec.Proc, g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if rec != nil {
		require.NoError(t, rec.Err())
	}
	if !t.Failed() {
		// Exit here: the stdin reader above never returns while the parent lives, and
		// pgtest.Main's goroutine-leak check would count it.
		pool.Close()
		os.Exit(0)
	}
}

// child is a re-executed test binary running TestHelperProcess.
type child struct {
	spec   helperSpec
	cmd    *exec.Cmd
	stdin  io.Closer
	out    *lockedBuffer
	exited chan struct{} // closed when Wait has returned; err is set then
	err    error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startChild re-executes the test binary as one child process. The test's cleanup kills
// it if it still runs and reaps it; when the test failed, it logs the child's output.
func startChild(t *testing.T, spec helperSpec) *child {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=3m")
	// A -race binary sleeps a second at exit (GORACE atexit_sleep_ms) to let reports
	// flush; a child has nothing to wait for.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw), "GORACE="+gorace)
	c := &child{spec: spec, cmd: cmd, out: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	c.stdin = stdin
	require.NoError(t, cmd.Start())
	go func() { // owned: waited for by the cleanup below
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Kill()
			<-c.exited // SIGKILL: Wait returns
		}
		_ = stdin.Close()
		if t.Failed() {
			t.Logf("child %s (pid %d, %v) output:\n%s", spec.Proc, cmd.Process.Pid, cmd.ProcessState, c.out.String())
		}
	})
	return c
}

// wait waits up to d for the child to exit and returns Wait's error.
func (c *child) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-c.exited:
		return c.err
	case <-time.After(d):
		t.Fatalf("child %s did not exit within %v; output:\n%s", c.spec.Proc, d, c.out.String())
		return nil
	}
}

// running fails the test if the child has exited.
func (c *child) running(t *testing.T) {
	t.Helper()
	select {
	case <-c.exited:
		t.Fatalf("child %s exited early (%v); output:\n%s", c.spec.Proc, c.err, c.out.String())
	default:
	}
}

// kill9 sends SIGKILL and reaps the child, checking that the signal is what ended it.
func (c *child) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	err := c.wait(t, waitBound)
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "child %s: %v", c.spec.Proc, err)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child %s ended with %v, not SIGKILL", c.spec.Proc, err)
}

// poll calls cond, in the test goroutine, every 5 ms until it returns true; it fails the
// test after waitBound.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitBound); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// createLedger makes the ledger table in a schema of the test's own and returns its
// quoted name.
func createLedger(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	ledger := pgx.Identifier{pgtest.Schema(t, pool), "ledger"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (
		id         bigserial PRIMARY KEY,
		key        bigint NOT NULL,
		proc       text NOT NULL,
		g          int NOT NULL,
		started_at timestamptz NOT NULL,
		ended_at   timestamptz,
		stuck      bool NOT NULL DEFAULT false)`)
	require.NoError(t, err)
	return ledger
}

// childApp returns an application_name unique to one child of this test run.
func childApp(t *testing.T, proc string) string {
	return fmt.Sprintf("pgxlock-test-child-%s-%08x", proc, uint32(pgtest.UniqueInt32(t)))
}

// 4 OS processes x 8 goroutines append to a ledger inside session locks on 3 keys; no two
// sections of one key overlap (checked in SQL on the server's clock). One process is
// SIGKILLed while it holds a key and others wait for it: the server ends its session,
// the waiters go on, and the other processes finish. The processes' histories, merged on
// the machine's monotonic clock, are checked for linearizability (history.LockModel).
func TestProcessesExcludeAndSurviveKilledHolder(t *testing.T) {
	const procs, goroutines, iters, stuckAt = 4, 8, 10, 1
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	ledger := createLedger(t, ctx, pool)
	ks := []int64{pgtest.UniqueInt64(t), pgtest.UniqueInt64(t), pgtest.UniqueInt64(t)}
	lockKeys := []keys.Key{keys.Int64(ks[0]), keys.Int64(ks[1]), keys.Int64(ks[2])}
	histDir := t.TempDir()

	var children []*child
	for i := range procs {
		spec := helperSpec{
			DSN: pgtest.DSN(t), Ledger: ledger, Proc: fmt.Sprintf("p%d", i),
			Keys: ks, Goroutines: goroutines, Iters: iters, StuckAt: -1,
			History: filepath.Join(histDir, fmt.Sprintf("p%d.jsonl", i)),
		}
		spec.App = childApp(t, spec.Proc)
		if i == 0 {
			spec.StuckAt = stuckAt // the victim
		}
		children = append(children, startChild(t, spec))
	}
	victim, others := children[0], children[1:]

	// The victim holds a key (its row with stuck set is written inside the section) and
	// another process waits for that key.
	var stuckKey int64
	poll(t, "the victim to get stuck inside a section", func() bool {
		victim.running(t)
		err := pool.QueryRow(ctx, "SELECT key FROM "+ledger+" WHERE stuck").Scan(&stuckKey)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	awaitLocks(t, ctx, pool, "another process to wait behind the stuck victim", func(ls []advisory.LockInfo) bool {
		victimHolds, othersWait := false, false
		for _, l := range ls {
			victimHolds = victimHolds || (l.Granted && l.ApplicationName == victim.spec.App)
			othersWait = othersWait || (!l.Granted && l.ApplicationName != victim.spec.App)
		}
		return victimHolds && othersWait
	}, keys.Int64(stuckKey))

	var killSent time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&killSent))
	victim.kill9(t)
	for _, c := range others {
		require.NoError(t, c.wait(t, 60*time.Second), "child %s; output:\n%s", c.spec.Proc, c.out.String())
	}

	// A section the victim had not finished lasted at least until the kill was sent (or,
	// for one that began between the clock reading and the signal, its own start).
	tag, err := pool.Exec(ctx, "UPDATE "+ledger+" SET ended_at = greatest(started_at, $1) WHERE proc = $2 AND ended_at IS NULL",
		killSent, victim.spec.Proc)
	require.NoError(t, err)
	t.Logf("victim killed holding %d key(s)", tag.RowsAffected())

	var unfinished, total int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE ended_at IS NULL), count(*) FROM "+ledger).Scan(&unfinished, &total))
	assert.Zero(t, unfinished, "sections of live processes never finished")
	for _, c := range others {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+ledger+" WHERE proc = $1", c.spec.Proc).Scan(&n))
		assert.Equal(t, goroutines*iters, n, "sections of %s", c.spec.Proc)
	}

	overlaps := func(sameKey bool) (int, []string) {
		op := "<>"
		if sameKey {
			op = "="
		}
		rows, err := pool.Query(ctx, `
			SELECT format('key %s: %s/g%s [%s, %s) overlaps %s/g%s [%s, %s)', a.key, a.proc, a.g, a.started_at, a.ended_at,
			              b.proc, b.g, b.started_at, b.ended_at)
			FROM `+ledger+` a JOIN `+ledger+` b ON a.id < b.id AND a.key `+op+` b.key
			 AND tstzrange(a.started_at, a.ended_at, '[)') && tstzrange(b.started_at, b.ended_at, '[)')`)
		require.NoError(t, err)
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return len(found), found[:min(len(found), 10)]
	}
	n, examples := overlaps(true)
	assert.Zero(t, n, "sections of one key overlap:\n%v", examples)
	// The check is not vacuous: sections of different keys did run at the same time.
	cross, _ := overlaps(false)
	assert.Positive(t, cross, "no two sections ever ran at once: the overlap check proves nothing")

	var firstAfter time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(started_at) FROM "+ledger+" WHERE key = $1 AND started_at > $2",
		stuckKey, killSent).Scan(&firstAfter))
	t.Logf("%d sections by %d processes x %d goroutines on %d keys; %d pairs on different keys overlapped, none on one key; "+
		"SIGKILL sent -> next section on the victim's key: %v",
		total, procs, goroutines, len(ks), cross, firstAfter.Sub(killSent))
	awaitLocks(t, ctx, pool, "the keys to be free", func(ls []advisory.LockInfo) bool { return len(ls) == 0 }, lockKeys...)

	var ops []history.Op
	for _, c := range children {
		got, err := history.ReadFile(c.spec.History)
		require.NoError(t, err)
		ops = append(ops, got...)
	}
	// The victim's sections end when the server drops its session, at a moment the
	// history does not show.
	history.Check(t, history.LockModel(), history.Crashed(ops, victim.spec.Proc))
}

// A waiter process killed with SIGKILL while queued does not block the queue: when the
// holder releases, the next live waiter acquires.
func TestProcessKilledWaiter(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	ledger := createLedger(t, ctx, pool)
	k := pgtest.UniqueInt64(t)
	key := keys.Int64(k)
	l := newLocker(t, pool, advisory.Config{})

	h, err := l.Lock(ctx, key, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Unlock(context.Background()) })

	spec := func(proc string) helperSpec {
		return helperSpec{DSN: pgtest.DSN(t), App: childApp(t, proc), Ledger: ledger, Proc: proc,
			Keys: []int64{k}, Goroutines: 1, Iters: 1, StuckAt: -1}
	}
	waitingApps := func(ls []advisory.LockInfo) map[string]bool {
		out := map[string]bool{}
		for _, l := range ls {
			if !l.Granted {
				out[l.ApplicationName] = true
			}
		}
		return out
	}
	doomed := startChild(t, spec("doomed"))
	awaitLocks(t, ctx, pool, "the doomed waiter to queue", func(ls []advisory.LockInfo) bool {
		doomed.running(t)
		return waitingApps(ls)[doomed.spec.App]
	}, key)
	live := startChild(t, spec("live"))
	awaitLocks(t, ctx, pool, "the live waiter to queue behind it", func(ls []advisory.LockInfo) bool {
		live.running(t)
		return waitingApps(ls)[live.spec.App]
	}, key)

	doomed.kill9(t)
	after, err := advisory.ListLocks(ctx, pool, key)
	require.NoError(t, err)
	t.Logf("after SIGKILL of the queued waiter, the server still lists its backend as waiting: %v "+
		"(a backend blocked in a lock wait does not read its socket; client_connection_check_interval makes it notice)",
		waitingApps(after)[doomed.spec.App])

	var releasedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&releasedAt))
	require.NoError(t, h.Unlock(ctx))
	require.NoError(t, live.wait(t, waitBound), "live waiter; output:\n%s", live.out.String())

	var procs []string
	rows, err := pool.Query(ctx, "SELECT proc FROM "+ledger+" ORDER BY id")
	require.NoError(t, err)
	procs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"live"}, procs, "sections run")
	var acquiredAt time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT started_at FROM "+ledger+" WHERE proc = 'live'").Scan(&acquiredAt))
	t.Logf("release -> live waiter inside its section (server clock): %v", acquiredAt.Sub(releasedAt))
	awaitLocks(t, ctx, pool, "the key to be free", func(ls []advisory.LockInfo) bool { return len(ls) == 0 }, key)
}
