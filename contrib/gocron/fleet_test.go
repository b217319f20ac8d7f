package pgxlockgocron_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// The fleet of issue 22: 3 processes x 50 one-second jobs with the Locker.
const (
	fleetProcs = 3
	fleetJobs  = 50
	fleetTicks = 10
	fleetEvery = time.Second
	// fleetMaxPinned is issue 22's target: the connections one process's held locks pin.
	fleetMaxPinned = 2
)

// fleetChild is a child of TestFleetLockerPinsFewConnections: a gocron scheduler on a
// fake clock with the Locker over advisory.Config{} (the defaults: whatever the
// package's default for held locks is) and spec.Jobs one-second jobs. Its stdin drives
// it: "tick" advances the clock one interval once every job's timer is set, "release"
// lets the runs of the current tick return, "stat" reports the pool's acquired and total
// connections, EOF stops it. Its stdout reports "ran TICK JOB", "skip TICK JOB",
// "success TICK JOB", "lockerror JOB ERR" (a Lock error other than ErrNotAcquired) and
// "stat ACQUIRED TOTAL".
func fleetChild(t *testing.T, spec helperSpec) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(spec.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	cfg.MaxConns = int32(spec.PoolSize)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	jl, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
	require.NoError(t, err)

	out := make(chan string, 4*len(spec.Jobs))
	printed := make(chan struct{})
	go func() { // owned: ends when out is closed below
		defer close(printed)
		for line := range out {
			fmt.Println(eventPrefix + line)
		}
	}()
	// tick is the number of "tick" lines read; a run started in tick n returns once
	// released >= n (a local repeat of a released tick returns at once).
	var (
		mu       sync.Mutex
		tick     int
		released int
		relCh    = make(chan struct{}) // closed and replaced at each release
	)
	current := func() int {
		mu.Lock()
		defer mu.Unlock()
		return tick
	}
	clock := clockwork.NewFakeClock()
	s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedLocker(jl),
		gocron.WithMonitor(fleetMonitor{out: out, tick: current}), gocron.WithStopTimeout(waitBound))
	require.NoError(t, err)
	var gjobs []gocron.Job
	for _, job := range spec.Jobs {
		gj, err := s.NewJob(gocron.DurationJob(fleetEvery), gocron.NewTask(func() {
			n := current()
			out <- fmt.Sprintf("ran %d %s", n, job)
			for {
				mu.Lock()
				if released >= n {
					mu.Unlock()
					return
				}
				ch := relCh
				mu.Unlock()
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
			}
		}), gocron.WithName(job), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
			if !errors.Is(err, advisory.ErrNotAcquired) {
				out <- fmt.Sprintf("lockerror %s %v", job, strings.ReplaceAll(err.Error(), "\n", " "))
			}
		})))
		require.NoError(t, err)
		gjobs = append(gjobs, gj)
	}
	s.Start()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "tick":
			require.NoError(t, clock.BlockUntilContext(ctx, len(spec.Jobs)))
			for _, gj := range gjobs {
				require.NoError(t, awaitRescheduled(ctx, clock, gj))
			}
			mu.Lock()
			tick++
			mu.Unlock()
			clock.Advance(fleetEvery)
		case "release":
			mu.Lock()
			released = tick
			close(relCh)
			relCh = make(chan struct{})
			mu.Unlock()
		case "stat":
			st := pool.Stat()
			out <- fmt.Sprintf("stat %d %d", st.AcquiredConns(), st.TotalConns())
		}
	}
	mu.Lock()
	released = math.MaxInt // nothing waits for a release any more
	close(relCh)
	mu.Unlock()
	require.NoError(t, s.Shutdown())
	close(out)
	<-printed
	pool.Close()
	os.Exit(0)
}

// fleetMonitor reports a fleet child's job outcomes with the tick they belong to.
type fleetMonitor struct {
	out  chan<- string
	tick func() int
}

func (m fleetMonitor) IncrementJob(_ uuid.UUID, name string, _ []string, status gocron.JobStatus) {
	switch status {
	case gocron.Skip:
		m.out <- fmt.Sprintf("skip %d %s", m.tick(), name)
	case gocron.Success:
		m.out <- fmt.Sprintf("success %d %s", m.tick(), name)
	default:
		m.out <- fmt.Sprintf("status %d %s %v", m.tick(), name, status)
	}
}

func (fleetMonitor) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// fleetBudget is the pool size of each fleet process: one connection per job and two to
// spare (with a connection per held lock every job of a tick may run in one process, and
// every Lock attempt holds one while it runs), unless the server has fewer connections to
// give (a shared server: then the dedicated form runs out of connections, which the test
// reports as lock errors).
func fleetBudget(t *testing.T, ctx context.Context, check *pgxpool.Pool) int {
	var maxConns, reserved, used int
	require.NoError(t, check.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)`).
		Scan(&maxConns, &reserved, &used))
	budget := (maxConns - reserved - used - 20) / fleetProcs
	return max(4, min(fleetJobs+2, budget))
}

// Issue 22's gocron fleet: 3 OS processes run a gocron scheduler each with the Locker on
// advisory.Config{} (the defaults), 50 jobs of one second on fake clocks the test
// advances together, 10 ticks. Every tick of every job is run by exactly one process
// while the two others skip it, and while all 50 runs of a tick hold their locks the
// test samples pg_stat_activity and pg_locks: no process pins more than 2 connections
// with its held locks, the first tick included (its 50 Lock calls come at once, before
// the process holds anything). With one connection per held lock (DisableMultiplexing, and the
// default before issue 22's multiplexing) a process pins one per running job, about 17
// and up to 50: this test fails until held locks share connections by default.
func TestFleetLockerPinsFewConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := pgtest.Pool(t)
	id := uint32(pgtest.UniqueInt32(t))
	jobs := make([]string, fleetJobs)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("fleet-%x-%02d", id, i)
	}
	poolSize := fleetBudget(t, ctx, check)
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")

	type proc struct {
		app    string
		stdin  io.WriteCloser
		exited chan error
	}
	type ev struct {
		proc  int
		kind  string
		tick  int
		job   string
		extra string
	}
	evs := make(chan ev, 10*fleetProcs*fleetJobs)
	var procs []*proc
	apps := make([]string, fleetProcs)
	for i := range fleetProcs {
		apps[i] = fmt.Sprintf("pgxlock-test-fleet-%d-%x", i, id)
		raw, err := json.Marshal(helperSpec{DSN: pgtest.DSN(t), App: apps[i], Jobs: jobs, PoolSize: poolSize})
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=3m")
		cmd.Env = append(os.Environ(), helperEnv+"="+string(raw), "GORACE="+gorace)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		p := &proc{app: apps[i], stdin: stdin, exited: make(chan error, 1)}
		go func() { // owned: ends at the child's exit (EOF); the cleanup reaps the child
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), eventPrefix)
				if !ok {
					continue
				}
				f := strings.SplitN(line, " ", 4)
				e := ev{proc: i, kind: f[0]}
				switch e.kind {
				case "ran", "skip", "success", "status":
					e.tick, _ = strconv.Atoi(f[1])
					e.job = f[2]
					if len(f) > 3 {
						e.extra = f[3]
					}
				case "lockerror":
					e.job, e.extra = f[1], strings.Join(f[2:], " ")
				case "stat":
					e.extra = strings.Join(f[1:], " ")
				}
				evs <- e
			}
			p.exited <- cmd.Wait()
		}()
		t.Cleanup(func() {
			_ = stdin.Close()
			select {
			case <-p.exited:
			case <-time.After(waitBound):
				_ = cmd.Process.Kill()
				<-p.exited
			}
		})
		procs = append(procs, p)
	}
	next := func(what string) ev {
		t.Helper()
		select {
		case e := <-evs:
			return e
		case <-time.After(waitBound):
			t.Fatalf("waited %v for %s", waitBound, what)
			return ev{}
		}
	}
	sendAll := func(line string) {
		for _, p := range procs {
			_, err := io.WriteString(p.stdin, line+"\n")
			require.NoError(t, err)
		}
	}

	type outcome struct {
		runner  int // -1: none yet
		repeats int // runs by the runner after its first in this tick (gocron's local repeat)
		skipped map[int]bool
	}
	var (
		runsPerProc              = make([]int, fleetProcs)
		maxPinned, maxBackends   = make([]int, fleetProcs), make([]int, fleetProcs)
		pinnedFirst, pinnedLater = make([]int, fleetProcs), make([]int, fleetProcs) // tick 1 (no connection set up yet), the others
		maxAcquired              = make([]int, fleetProcs)
		lockErrors               []string
		missed, repeats          int
		inFlight                 = map[string]int{} // job: runs started and not yet reported done
		lateRepeat               = map[string]bool{}
	)
	// absorb handles an event of an earlier tick or of no tick: a late local repeat, its
	// success, a lock error.
	absorb := func(e ev, cur int) bool {
		switch {
		case e.kind == "lockerror":
			lockErrors = append(lockErrors, fmt.Sprintf("process %d, %s: %s", e.proc, e.job, e.extra))
			return true
		case e.kind == "success":
			inFlight[e.job]--
			return true
		case e.kind == "ran" && e.tick < cur:
			t.Logf("process %d ran %s of tick %d again during tick %d (a local repeat)", e.proc, e.job, e.tick, cur)
			inFlight[e.job]++
			lateRepeat[e.job] = true
			repeats++
			return true
		case e.kind == "skip" && e.tick < cur:
			return true // a local repeat of a finished tick found its own run's lock busy
		case e.kind == "status":
			t.Fatalf("process %d: %s tick %d: status %s", e.proc, e.job, e.tick, e.extra)
		}
		return false
	}

	for tick := 1; tick <= fleetTicks; tick++ {
		sendAll("tick")
		outs := map[string]*outcome{}
		for _, j := range jobs {
			outs[j] = &outcome{runner: -1, skipped: map[int]bool{}}
		}
		done := func(o *outcome) bool {
			others := 0
			for p := range o.skipped {
				if p != o.runner {
					others++
				}
			}
			return (o.runner >= 0 && others == fleetProcs-1) || (o.runner < 0 && others == fleetProcs)
		}
		for pending := fleetJobs; pending > 0; {
			e := next(fmt.Sprintf("tick %d: %d jobs without an outcome", tick, pending))
			if absorb(e, tick) {
				continue
			}
			require.Equal(t, tick, e.tick, "process %d: %s %s", e.proc, e.kind, e.job)
			o := outs[e.job]
			require.NotNil(t, o, "unknown job %q", e.job)
			was := done(o)
			switch e.kind {
			case "ran":
				require.True(t, o.runner < 0 || o.runner == e.proc,
					"tick %d: %s run by process %d and by process %d", tick, e.job, o.runner, e.proc)
				if o.runner == e.proc {
					o.repeats++
					repeats++
				}
				o.runner = e.proc
				inFlight[e.job]++
			case "skip":
				o.skipped[e.proc] = true
			}
			if !was && done(o) {
				pending--
			}
		}
		// Every job of the tick has its outcome; the runs hold their locks until the
		// release. Sample what the processes pin.
		rows, err := check.Query(ctx, `SELECT a.application_name, count(DISTINCT a.pid), count(DISTINCT l.pid), count(l.pid)
			FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
			WHERE a.application_name = ANY($1) GROUP BY 1`, apps)
		require.NoError(t, err)
		held := 0
		for rows.Next() {
			var app string
			var backends, pinned, locks int
			require.NoError(t, rows.Scan(&app, &backends, &pinned, &locks))
			for i, a := range apps {
				if a == app {
					maxPinned[i], maxBackends[i] = max(maxPinned[i], pinned), max(maxBackends[i], backends)
					if tick == 1 {
						pinnedFirst[i] = pinned
					} else {
						pinnedLater[i] = max(pinnedLater[i], pinned)
					}
				}
			}
			held += locks
		}
		require.NoError(t, rows.Err())
		ran := 0
		for j, o := range outs {
			switch {
			case o.runner >= 0:
				ran++
				runsPerProc[o.runner]++
			case lateRepeat[j]:
				t.Logf("tick %d: %s skipped by every process while a local repeat of the tick before held it", tick, j)
			default:
				missed++
			}
		}
		assert.Equal(t, ran, held, "tick %d: %d runs hold %d advisory locks at the sample", tick, ran, held)
		sendAll("stat")
		for got := 0; got < fleetProcs; {
			e := next("stat")
			if absorb(e, tick+1) {
				continue
			}
			require.Equal(t, "stat", e.kind, "process %d: %s %s", e.proc, e.kind, e.job)
			var acquired, total int
			_, err := fmt.Sscan(e.extra, &acquired, &total)
			require.NoError(t, err)
			maxAcquired[e.proc] = max(maxAcquired[e.proc], acquired)
			got++
		}
		sendAll("release")
		// The runs return and unlock; the next tick starts with every job's key free.
		for busy := true; busy; {
			busy = false
			for _, n := range inFlight {
				busy = busy || n > 0
			}
			if busy {
				e := next(fmt.Sprintf("tick %d: runs to end", tick))
				require.True(t, absorb(e, tick+1), "tick %d: process %d: %s %s of tick %d", tick, e.proc, e.kind, e.job, e.tick)
			}
		}
		clear(lateRepeat)
		poll(t, "the fleet's locks to be released", func() bool {
			var n int
			require.NoError(t, check.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND a.application_name = ANY($1)`, apps).Scan(&n))
			return n == 0
		})
	}
	for i, p := range procs {
		require.NoError(t, p.stdin.Close())
		for exited := false; !exited; {
			select {
			case err := <-p.exited:
				require.NoError(t, err, "process %d", i)
				exited = true
			case e := <-evs:
				absorb(e, fleetTicks+1)
			case <-time.After(waitBound):
				t.Fatalf("process %d did not exit", i)
			}
		}
		p.exited <- nil // for the cleanup
	}
	t.Logf("pool %d per process; runs per process %v; max pinned connections per process %v (first tick %v, later ticks %v), max backends %v, max acquired (pool.Stat) %v; %d local repeats",
		poolSize, runsPerProc, maxPinned, pinnedFirst, pinnedLater, maxBackends, maxAcquired, repeats)
	if len(lockErrors) > 0 {
		t.Errorf("%d Lock errors other than ErrNotAcquired (pool of %d per process), the first: %s",
			len(lockErrors), poolSize, strings.Join(lockErrors[:min(3, len(lockErrors))], "; "))
	}
	assert.Zero(t, missed, "job ticks no process ran")
	for i := range procs {
		assert.LessOrEqual(t, maxPinned[i], fleetMaxPinned,
			"process %d pinned %d connections with its held locks (first tick %d, later ticks at most %d; at most %d once held locks share connections, issue 22)",
			i, maxPinned[i], pinnedFirst[i], pinnedLater[i], fleetMaxPinned)
	}
}
