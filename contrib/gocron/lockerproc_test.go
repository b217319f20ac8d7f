package pgxlockgocron_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
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

// eventPrefix marks a child's event lines on its stdout.
const eventPrefix = "EVENT "

// lockerChild is a child of TestProcessesLockerEachTickRunsOnce: a gocron scheduler on a
// fake clock with the Locker. Its stdin drives it: "tick" advances the clock one interval,
// "release" lets a blocked run finish, EOF stops it. Its stdout reports "ran", "skip"
// (busy lock) and "success".
func lockerChild(t *testing.T, spec helperSpec) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(spec.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l, err := advisory.New(pool, advisory.Config{})
	require.NoError(t, err)
	jl, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
	require.NoError(t, err)

	out := make(chan string, 100)
	go func() { // owned: ends when out is closed below
		for line := range out {
			fmt.Println(eventPrefix + line)
		}
	}()
	release := make(chan struct{})
	events := make(chan event, 100)
	clock := clockwork.NewFakeClock()
	s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedLocker(jl),
		gocron.WithMonitor(monitor{0, events}))
	require.NoError(t, err)
	job, err := s.NewJob(gocron.DurationJob(interval), gocron.NewTask(func() {
		out <- "ran"
		<-release
	}), gocron.WithName(spec.Job), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
		if !errors.Is(err, advisory.ErrNotAcquired) {
			out <- fmt.Sprintf("lockerror %v", err)
		}
	})))
	require.NoError(t, err)
	eventsDone := make(chan struct{})
	go func() { // owned: ends when events is closed below
		defer close(eventsDone)
		for e := range events {
			switch e.status {
			case gocron.Skip:
				out <- "skip"
			case gocron.Success:
				out <- "success"
			default:
				out <- fmt.Sprintf("status %v", e.status)
			}
		}
	}()
	s.Start()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "tick":
			require.NoError(t, clock.BlockUntilContext(ctx, 1))
			require.NoError(t, awaitRescheduled(ctx, clock, job))
			clock.Advance(interval)
		case "release":
			release <- struct{}{}
		}
	}
	close(release)
	require.NoError(t, s.Shutdown())
	close(events)
	<-eventsDone
	close(out)
	pool.Close()
	os.Exit(0) // the event printers may still be draining; nothing else to wait for
}

// 3 OS processes run a gocron scheduler each with the Locker, on fake clocks the test
// advances together: for 15 ticks of 200 ms, every tick is run by exactly one process
// while the other two skip it (their Lock fails with ErrNotAcquired), and no lock is
// left afterwards.
func TestProcessesLockerEachTickRunsOnce(t *testing.T) {
	ctx := testCtx(t)
	check := pgtest.Pool(t)
	job := fmt.Sprintf("report-%x", uint64(pgtest.UniqueInt64(t)))
	jobKey := keys.Hash(job)
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")

	type proc struct {
		stdin  io.WriteCloser
		exited chan error
	}
	type ev struct {
		proc int
		what string
	}
	evs := make(chan ev, 1000)
	var procs []*proc
	for i := range 3 {
		raw, err := json.Marshal(helperSpec{DSN: pgtest.DSN(t), Job: job,
			App: fmt.Sprintf("pgxlock-test-gocron-l%d-%x", i, uint32(pgtest.UniqueInt32(t)))})
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=3m")
		cmd.Env = append(os.Environ(), helperEnv+"="+string(raw), "GORACE="+gorace)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		p := &proc{stdin: stdin, exited: make(chan error, 1)}
		go func() { // owned: ends at the child's exit (EOF); the cleanup reaps the child
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), eventPrefix); ok {
					evs <- ev{i, line}
				}
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
	send := func(p *proc, line string) {
		_, err := io.WriteString(p.stdin, line+"\n")
		require.NoError(t, err)
	}
	runs := map[int]int{}
	for tick := range 15 {
		for _, p := range procs {
			send(p, "tick")
		}
		runner, skips := -1, 0
		for runner < 0 || skips < 2 {
			e := next(fmt.Sprintf("tick %d", tick))
			switch e.what {
			case "ran":
				require.Equal(t, -1, runner, "tick %d: process %d ran it after process %d", tick, e.proc, runner)
				runner = e.proc
			case "skip":
				skips++
				require.LessOrEqual(t, skips, 2, "tick %d", tick)
			default:
				t.Fatalf("tick %d: process %d: %s", tick, e.proc, e.what)
			}
		}
		send(procs[runner], "release")
		require.Equal(t, ev{runner, "success"}, next("the run to end"))
		runs[runner]++
		poll(t, "the job's lock to be released", func() bool { return holders(t, ctx, check, jobKey) == 0 })
	}
	t.Logf("runs per process: %v", runs)
	for i, p := range procs {
		require.NoError(t, p.stdin.Close())
		select {
		case err := <-p.exited:
			require.NoError(t, err, "process %d", i)
		case <-time.After(waitBound):
			t.Fatalf("process %d did not exit", i)
		}
		p.exited <- nil // for the cleanup
	}
	require.Zero(t, holders(t, ctx, check, jobKey))
}
