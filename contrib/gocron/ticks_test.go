package pgxlockgocron_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// waitBound bounds every wait of these tests.
const waitBound = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// event is a job outcome one scheduler reported to its gocron.Monitor.
type event struct {
	sched  int
	status gocron.JobStatus
}

type monitor struct {
	sched  int
	events chan<- event
}

func (m monitor) IncrementJob(_ uuid.UUID, _ string, _ []string, status gocron.JobStatus) {
	m.events <- event{m.sched, status}
}

func (monitor) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// tickRig is 3 gocron schedulers, each on its own pool and fake clock,
// running one job every 200 ms of fake time.
type tickRig struct {
	clocks  []*clockwork.FakeClock
	scheds  []gocron.Scheduler
	events  chan event    // Success, Fail and Skip, from every scheduler
	ran     chan int      // a run started (the scheduler's index)
	proceed chan struct{} // lets one blocked run finish
	lockErr chan error    // AfterLockError (Locker only)
	jobs    []gocron.Job  // the job, in each scheduler
	locker  bool          // the schedulers use the Locker: tick awaits awaitRescheduled
}

// awaitRescheduled waits until job's first next run time is after clock's now. On a skip
// (its Lock failed) gocron's executor reports Skip to the monitor first and only then asks
// the scheduler to drop the run times that are not after now. If the clock is advanced
// between the two, the drop runs with the new now and also removes the run just scheduled
// for it; the firing timer's rescheduling then finds no run time and computes the next one
// from the zero time, which on a fake clock at a whole second is now itself, and gocron
// fires the job again within the tick: a scheduler that skipped the tick, tried again after
// the runner unlocked, and ran it a second time (CI, once; every run with the Skip report
// held until the clock moves). Until the drop, the first run time is now; after it, the
// next tick's.
func awaitRescheduled(ctx context.Context, clock clockwork.Clock, job gocron.Job) error {
	for {
		next, err := job.NextRun()
		if err != nil {
			return err
		}
		if next.After(clock.Now()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("job %s: next run %v is not after now %v: %w", job.Name(), next, clock.Now(), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

const interval = 200 * time.Millisecond

// newTickRig starts 3 schedulers; opts(i, locker) gives scheduler i's
// distributed option, locker being an advisory.Locker on its own pool.
func newTickRig(t *testing.T, jobName string, opts func(i int, l *advisory.Locker) gocron.SchedulerOption) *tickRig {
	r := &tickRig{events: make(chan event, 1000), ran: make(chan int, 1000), proceed: make(chan struct{}),
		lockErr: make(chan error, 1000)}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		l, err := advisory.New(pgtest.Pool(t), advisory.Config{})
		require.NoError(t, err)
		clock := clockwork.NewFakeClockAt(start)
		s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithMonitor(monitor{i, r.events}), opts(i, l),
			gocron.WithStopTimeout(waitBound))
		require.NoError(t, err)
		j, err := s.NewJob(gocron.DurationJob(interval), gocron.NewTask(func() {
			r.ran <- i
			<-r.proceed
		}), gocron.WithName(jobName), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
			r.lockErr <- err
		})))
		require.NoError(t, err)
		r.clocks, r.scheds, r.jobs = append(r.clocks, clock), append(r.scheds, s), append(r.jobs, j)
	}
	for _, s := range r.scheds {
		s.Start()
	}
	t.Cleanup(func() {
		close(r.proceed) // unblock any run still waiting
		for _, s := range r.scheds {
			require.NoError(t, s.Shutdown())
		}
	})
	return r
}

// tick advances every scheduler's clock by one interval and waits for the
// tick's outcome: one scheduler runs the job, the two others skip it. It
// returns the runner after letting its run finish. With the Locker it first
// waits for each scheduler's past run times to be dropped (awaitRescheduled).
//
// With the Elector, gocron on a fake clock has once (in many runs) fired the
// runner's timer a second time within one tick; that is the scheduler's local
// repeat, not a second scheduler running the tick, so it is let through; a
// run by any other scheduler fails the test.
func (r *tickRig) tick(t *testing.T, ctx context.Context, n int) int {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	for i, c := range r.clocks {
		require.NoError(t, c.BlockUntilContext(wctx, 1), "scheduler timer")
		if r.locker {
			require.NoError(t, awaitRescheduled(wctx, c, r.jobs[i]), "scheduler %d", i)
		}
	}
	for _, c := range r.clocks {
		c.Advance(interval)
	}
	runner, runs := -1, 0
	skipped := map[int]bool{}
	others := func() int {
		k := 0
		for s := range skipped {
			if s != runner {
				k++
			}
		}
		return k
	}
	for runner < 0 || others() < 2 {
		select {
		case i := <-r.ran:
			if runner >= 0 {
				require.Equal(t, runner, i, "tick %d: scheduler %d ran it too, after scheduler %d", n, i, runner)
			}
			runner = i
			runs++
		case e := <-r.events:
			require.Equal(t, gocron.Skip, e.status, "tick %d: scheduler %d", n, e.sched)
			skipped[e.sched] = true
		case <-wctx.Done():
			t.Fatalf("tick %d: runner %d, skips by %v after %v", n, runner, skipped, waitBound)
		}
	}
	for done := 0; done < runs; {
		select {
		case r.proceed <- struct{}{}:
		case i := <-r.ran:
			require.Equal(t, runner, i, "tick %d: scheduler %d ran it too, after scheduler %d", n, i, runner)
			runs++
		case e := <-r.events:
			if e.status == gocron.Skip && e.sched == runner {
				continue
			}
			require.Equal(t, event{runner, gocron.Success}, e, "tick %d", n)
			done++
		case <-wctx.Done():
			t.Fatalf("tick %d: the run of scheduler %d did not end", n, runner)
		}
	}
	return runner
}

// settle polls cond (as poll does) between ticks while letting a local
// repeat run by the tick's runner finish: gocron's fake-clock timer that
// fires twice within one tick (see tick) can start the runner's second run
// after tick returned, and that run holds the lock until it may proceed. A
// run or an outcome by a scheduler that is not the last runner fails the
// test.
func (r *tickRig) settle(t *testing.T, ctx context.Context, runner int, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitBound, what)
		}
		select {
		case i := <-r.ran:
			require.Equal(t, runner, i, "scheduler %d ran the job between ticks; the last runner was %d", i, runner)
			t.Logf("scheduler %d ran the job again after its tick (a local repeat)", i)
			select {
			case r.proceed <- struct{}{}:
			case <-ctx.Done():
				t.Fatal("the repeat run did not take its proceed")
			}
		wait:
			for {
				select {
				case e := <-r.events:
					require.Equal(t, i, e.sched, "an outcome of another scheduler between ticks")
					if e.status == gocron.Success {
						break wait
					}
				case <-ctx.Done():
					t.Fatal("the repeat run did not end")
				}
			}
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// holders counts sessions holding or awaiting k.
func holders(t *testing.T, ctx context.Context, pool *pgxpool.Pool, k keys.Key) int {
	c, o, s := k.PgLocks()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1 AND objid = $2 AND objsubid = $3`, c, o, s).Scan(&n))
	return n
}

// poll calls cond every 5 ms until it returns true, failing after waitBound.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitBound); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// 3 schedulers with the Locker run a job every 200 ms for 3 s (15 ticks of
// fake time): on every tick exactly one scheduler runs it while the run
// holds the lock, and the other two skip it, their Lock failing with
// ErrNotAcquired.
func TestLockerEachTickRunsOnce(t *testing.T) {
	ctx := testCtx(t)
	check := pgtest.Pool(t)
	name := fmt.Sprintf("report-%x", uint64(pgtest.UniqueInt64(t)))
	var jobKey keys.Key
	r := newTickRig(t, name, func(i int, l *advisory.Locker) gocron.SchedulerOption {
		jl, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
		require.NoError(t, err)
		jobKey, err = jl.Key(name)
		require.NoError(t, err)
		return gocron.WithDistributedLocker(jl)
	})
	r.locker = true
	require.Equal(t, keys.Hash(name), jobKey)
	runners := map[int]int{}
	for n := range 15 {
		runner := r.tick(t, ctx, n)
		runners[runner]++
		for range 2 {
			select {
			case err := <-r.lockErr:
				require.ErrorIs(t, err, advisory.ErrNotAcquired)
			case <-ctx.Done():
				t.Fatal("lock error not reported")
			}
		}
		// The runner unlocks after reporting success; the next tick starts
		// with the key free.
		r.settle(t, ctx, runner, "the job's lock to be released", func() bool { return holders(t, ctx, check, jobKey) == 0 })
	}
	t.Logf("runs per scheduler: %v", runners)
}

// 3 schedulers with an Elector each: the first to ask leads and runs every
// tick; the others skip every tick.
func TestElectorLeaderRunsEveryTick(t *testing.T) {
	ctx := testCtx(t)
	name := fmt.Sprintf("election-%x", uint64(pgtest.UniqueInt64(t)))
	var mu sync.Mutex
	var electors []*pgxlockgocron.Elector
	r := newTickRig(t, "job", func(i int, l *advisory.Locker) gocron.SchedulerOption {
		e, err := pgxlockgocron.NewElector(l, name, pgxlockgocron.Config{})
		require.NoError(t, err)
		mu.Lock()
		electors = append(electors, e)
		mu.Unlock()
		return gocron.WithDistributedElector(e)
	})
	t.Cleanup(func() {
		for _, e := range electors {
			require.NoError(t, e.Close(context.Background()))
		}
	})
	leader := r.tick(t, ctx, 0)
	for n := 1; n < 15; n++ {
		require.Equal(t, leader, r.tick(t, ctx, n), "leadership moved without a loss")
	}
}

// When the leader's backend is terminated its lock goes at once: its next
// IsLeader reports the loss (ErrLockLost), another elector takes over, and
// the old one contends again afterwards.
func TestElectorLossHandsOver(t *testing.T) {
	ctx := testCtx(t)
	check := pgtest.Pool(t)
	name := fmt.Sprintf("election-%x", uint64(pgtest.UniqueInt64(t)))
	var es []*pgxlockgocron.Elector
	for range 3 {
		l, err := advisory.New(pgtest.Pool(t), advisory.Config{})
		require.NoError(t, err)
		e, err := pgxlockgocron.NewElector(l, name, pgxlockgocron.Config{})
		require.NoError(t, err)
		es = append(es, e)
	}
	t.Cleanup(func() {
		for _, e := range es {
			require.NoError(t, e.Close(context.Background()))
		}
	})
	require.NoError(t, es[0].IsLeader(ctx))
	require.NoError(t, es[0].IsLeader(ctx), "a leader stays leader")
	require.ErrorIs(t, es[1].IsLeader(ctx), advisory.ErrNotAcquired)
	require.ErrorIs(t, es[2].IsLeader(ctx), advisory.ErrNotAcquired)

	c, o, s := es[0].Key().PgLocks()
	var terminated bool
	require.NoError(t, check.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = $1 AND objid = $2 AND objsubid = $3`, c, o, s).Scan(&terminated))
	require.True(t, terminated)
	poll(t, "the new leader", func() bool { return es[1].IsLeader(ctx) == nil })
	require.ErrorIs(t, es[2].IsLeader(ctx), advisory.ErrNotAcquired)
	// The old leader learns of the loss once, then contends again (and loses).
	var err error
	poll(t, "the old leader to see its loss", func() bool {
		err = es[0].IsLeader(ctx)
		return err != nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	require.ErrorIs(t, es[0].IsLeader(ctx), advisory.ErrNotAcquired)

	require.NoError(t, es[1].Close(ctx))
	require.ErrorIs(t, es[1].IsLeader(ctx), pgxlockgocron.ErrClosed)
	require.NoError(t, es[2].IsLeader(ctx), "resigning frees the lock for the next")
}

// testNS is registered once per test binary (-count=N runs tests again).
var testNS = keys.MustRegisterNamespace(0x67637274, "gocron-test")

func TestInvalidInput(t *testing.T) {
	_, err := pgxlockgocron.NewLocker(nil, pgxlockgocron.Config{})
	require.ErrorIs(t, err, advisory.ErrInvalid)
	_, err = pgxlockgocron.NewElector(nil, "x", pgxlockgocron.Config{})
	require.ErrorIs(t, err, advisory.ErrInvalid)
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{})
	require.NoError(t, err)
	_, err = pgxlockgocron.NewElector(l, "", pgxlockgocron.Config{})
	require.ErrorIs(t, err, advisory.ErrInvalid)
	jl, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
	require.NoError(t, err)
	_, err = jl.Lock(context.Background(), "")
	require.ErrorIs(t, err, advisory.ErrInvalid)
	ns := testNS
	jl, err = pgxlockgocron.NewLocker(l, pgxlockgocron.Config{Namespace: ns})
	require.NoError(t, err)
	k, err := jl.Key("job")
	require.NoError(t, err)
	want, _ := ns.Hash("job")
	require.Equal(t, want, k)
}
