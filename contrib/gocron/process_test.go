package pgxlockgocron_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// helperEnv carries a helperSpec (JSON) to a re-executed test binary.
const helperEnv = "PGXLOCK_GOCRON_TEST_HELPER"

// The children's loss detection: a leader that cannot see its loss at once
// sees it within heartbeatInterval + heartbeatTimeout.
const heartbeatInterval, heartbeatTimeout = 2 * time.Second, 2 * time.Second

type helperSpec struct {
	DSN      string
	App      string
	Ledger   string // quoted table name
	Proc     string
	Election string
	Job      string   // Locker mode: the job's name (Election is empty)
	Jobs     []string // fleet mode (fleetChild): the jobs' names
	PoolSize int      // fleet mode: the pool's MaxConns
}

// TestHelperProcess is not a test: it is the body of the child processes
// of TestProcessesElectorSIGKILL (and, with Job or Jobs set, of the Locker
// tests' children: lockerChild, fleetChild), run when helperEnv is set: a gocron
// scheduler with an Elector, running a job every 200 ms that records itself
// in the ledger, until its stdin closes.
func TestHelperProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var spec helperSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	if len(spec.Jobs) > 0 {
		fleetChild(t, spec)
		return
	}
	if spec.Job != "" {
		lockerChild(t, spec)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(spec.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l, err := advisory.New(pool, advisory.Config{HeartbeatInterval: heartbeatInterval, HeartbeatTimeout: heartbeatTimeout})
	require.NoError(t, err)
	e, err := pgxlockgocron.NewElector(l, spec.Election, pgxlockgocron.Config{})
	require.NoError(t, err)
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
	require.NoError(t, err)
	_, err = s.NewJob(gocron.DurationJob(interval), gocron.NewTask(func(ctx context.Context) {
		_, err := pool.Exec(ctx, "INSERT INTO "+spec.Ledger+" (proc) VALUES ($1)", spec.Proc)
		if err != nil && ctx.Err() == nil {
			t.Errorf("ledger: %v", err)
		}
	}))
	require.NoError(t, err)
	s.Start()
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
	require.NoError(t, s.Shutdown())
	require.NoError(t, e.Close(ctx))
}

type run struct {
	Proc string
	At   time.Time
}

// 3 OS processes run a gocron scheduler each with an Elector on one
// election, a job every 200 ms. Only the leader runs it; SIGKILL of the
// leader's process hands leadership to another within heartbeat interval +
// timeout (in fact at its next tick: PostgreSQL frees a dead session's lock
// at once); the runs never interleave; no advisory lock is left.
func TestProcessesElectorSIGKILL(t *testing.T) {
	ctx := testCtx(t)
	check := pgtest.Pool(t)
	ledger := pgx.Identifier{pgtest.Schema(t, check), "ledger"}.Sanitize()
	_, err := check.Exec(ctx, "CREATE TABLE "+ledger+" (id bigserial PRIMARY KEY, proc text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
	require.NoError(t, err)
	election := fmt.Sprintf("election-%x", uint64(pgtest.UniqueInt64(t)))
	l, err := advisory.New(check, advisory.Config{})
	require.NoError(t, err)
	probe, err := pgxlockgocron.NewElector(l, election, pgxlockgocron.Config{})
	require.NoError(t, err)

	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	type child struct {
		cmd    *exec.Cmd
		stdin  io.Closer
		out    *syncBuffer
		exited chan struct{}
		err    error
	}
	children := map[string]*child{}
	for i := range 3 {
		proc := fmt.Sprintf("p%d", i)
		raw, err := json.Marshal(helperSpec{DSN: pgtest.DSN(t), App: fmt.Sprintf("pgxlock-test-gocron-%s-%x", proc, uint32(pgtest.UniqueInt32(t))),
			Ledger: ledger, Proc: proc, Election: election})
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=3m")
		cmd.Env = append(os.Environ(), helperEnv+"="+string(raw), "GORACE="+gorace)
		c := &child{cmd: cmd, out: &syncBuffer{}, exited: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = c.out, c.out
		c.stdin, err = cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		go func() { c.err = cmd.Wait(); close(c.exited) }() // owned: the cleanup waits
		t.Cleanup(func() {
			select {
			case <-c.exited:
			default:
				_ = cmd.Process.Kill()
				<-c.exited
			}
			if t.Failed() {
				t.Logf("child %s: %v\n%s", proc, c.err, c.out.String())
			}
		})
		children[proc] = c
	}

	runs := func() []run {
		rows, err := check.Query(ctx, "SELECT proc, at FROM "+ledger+" ORDER BY at, id")
		require.NoError(t, err)
		rs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[run])
		require.NoError(t, err)
		return rs
	}
	poll(t, "5 runs", func() bool { return len(runs()) >= 5 })
	before := runs()
	leader := before[0].Proc
	for _, r := range before {
		require.Equal(t, leader, r.Proc, "only the leader runs the job")
	}
	require.ErrorIs(t, probe.IsLeader(ctx), advisory.ErrNotAcquired, "the election is held")

	// SIGKILL the leader and reap it.
	old := children[leader]
	require.NoError(t, old.cmd.Process.Signal(syscall.SIGKILL))
	<-old.exited
	var ee *exec.ExitError
	require.True(t, errors.As(old.err, &ee))
	var killedAt time.Time
	require.NoError(t, check.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&killedAt))

	// The handover, bounded by the loss-detection bound plus one tick.
	bound := heartbeatInterval + heartbeatTimeout + interval
	deadline := time.Now().Add(bound)
	for {
		rs := runs()
		if rs[len(rs)-1].Proc != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader ran the job within %v of the SIGKILL", bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	poll(t, "5 runs by the new leader", func() bool {
		rs := runs()
		return len(rs) >= len(before)+5
	})
	all := runs()
	var next string
	for _, r := range all {
		switch {
		case r.Proc == leader:
			require.True(t, r.At.Before(killedAt), "the killed leader ran after its death")
			require.Empty(t, next, "runs of the old and new leaders interleave")
		case next == "":
			next = r.Proc
		default:
			require.Equal(t, next, r.Proc, "two schedulers ran the job after the handover")
		}
	}
	t.Logf("leader %s, then %s; %d runs", leader, next, len(all))

	// Stop the survivors; they resign and exit cleanly; nothing stays locked.
	for proc, c := range children {
		if proc == leader {
			continue
		}
		require.NoError(t, c.stdin.Close())
		select {
		case <-c.exited:
			require.NoError(t, c.err, "child %s:\n%s", proc, c.out.String())
		case <-time.After(waitBound):
			t.Fatalf("child %s did not exit", proc)
		}
	}
	poll(t, "no lock on the election", func() bool { return holders(t, ctx, check, probe.Key()) == 0 })
	require.NoError(t, probe.Close(ctx))
}

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
