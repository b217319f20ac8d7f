package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/examples/internal/extest"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var tickLine = regexp.MustCompile(`^\S+ (\S+)\s+tick (\S+)  (.*)$`)

// Three replicas in one process: every tick that ran was run by exactly one replica, at
// least one ran, no replica reports two outcomes for one tick, and no two runs overlap.
// Nothing here counts ticks per wall-clock second: on a loaded machine a replica's timer
// may fire late, or its job overrun the next tick, and that must not fail the test.
func TestReplicasInProcess(t *testing.T) {
	url := extest.DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out syncBuilder
	cfg := config{URL: url, Replicas: 3, Name: "r", Every: 300 * time.Millisecond,
		JobTime: 50 * time.Millisecond, Duration: 1800 * time.Millisecond}
	require.NoError(t, run(ctx, cfg, &out))
	t.Log("\n" + out.String())

	ran := map[string][]string{}         // tick -> replicas that ran it
	outcomes := map[[2]string][]string{} // (tick, replica) -> what the replica reported
	for _, line := range strings.Split(out.String(), "\n") {
		m := tickLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		tick, replica := m[2], m[1]
		switch {
		case m[3] == "running the job":
			ran[tick] = append(ran[tick], replica)
			outcomes[[2]string{tick, replica}] = append(outcomes[[2]string{tick, replica}], "ran")
		case strings.HasPrefix(m[3], "skipped"):
			outcomes[[2]string{tick, replica}] = append(outcomes[[2]string{tick, replica}], "skipped")
		}
	}
	require.NotEmpty(t, ran, "no tick ran")
	for tick, replicas := range ran {
		assert.Len(t, replicas, 1, "tick %s run by %v", tick, replicas)
	}
	for k, o := range outcomes {
		assert.Len(t, o, 1, "replica %s reported %v for tick %s", k[1], o, k[0])
	}
	assert.Contains(t, out.String(), "overlapping runs: 0")

	conn := extest.Connect(t, url)
	var rows, unfinished int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE finished_at IS NULL)
		FROM pgxlock_example_cron.cron_runs`).Scan(&rows, &unfinished))
	assert.Equal(t, len(ran), rows)
	assert.Zero(t, unfinished)
}

// Three processes, one replica each. The process running a tick is SIGKILLed in the
// middle of its job: PostgreSQL drops its session and its lock, and another process runs
// a later tick.
func TestKillRunnerAnotherTakesOver(t *testing.T) {
	bin := extest.Build(t)
	url := extest.DatabaseURL(t)
	env := []string{exampledb.EnvURL + "=" + url}
	// The job outlasts the tick, so the victim is surely still in it when killed; the
	// others skip the ticks it overruns (the lock is busy).
	args := []string{"--replicas=1", "--every=500ms", "--job-time=3s", "--duration=0"}
	var procs []*extest.Proc
	for _, name := range []string{"a", "b", "c"} {
		procs = append(procs, extest.Start(t, name, bin, env, append(args, "--name="+name)...))
	}

	victim, line := extest.WaitAny(t, procs, nil, "running the job", 10*time.Second)
	killedTick := tickLine.FindStringSubmatch(procs[victim].Lines()[line])[2]
	require.NoError(t, procs[victim].Cmd.Process.Signal(syscall.SIGKILL))
	procs[victim].Wait(t, 5*time.Second)
	t.Logf("killed %s while it ran tick %s", procs[victim].Name, killedTick)

	// Only output printed after the kill counts.
	var survivors []*extest.Proc
	var from []int
	for i, p := range procs {
		if i != victim {
			survivors = append(survivors, p)
			from = append(from, len(p.Lines()))
		}
	}
	s, line := extest.WaitAny(t, survivors, from, "running the job", 10*time.Second)
	tick := tickLine.FindStringSubmatch(survivors[s].Lines()[line])[2]
	assert.Greater(t, tick, killedTick, "ticks are clock times of one day")
	t.Logf("%s took over at tick %s", survivors[s].Name, tick)

	// The survivors stop cleanly on SIGINT (exit code 130, the shell's convention).
	for _, p := range survivors {
		require.NoError(t, p.Cmd.Process.Signal(syscall.SIGINT))
	}
	for _, p := range survivors {
		assert.Equal(t, 130, p.Wait(t, 10*time.Second), p.Name)
	}

	conn := extest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var killedFinished *time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT finished_at FROM pgxlock_example_cron.cron_runs
		WHERE replica = $1 ORDER BY tick DESC LIMIT 1`, procs[victim].Name).Scan(&killedFinished))
	assert.Nil(t, killedFinished, "the killed run never finished")
}

// With DATABASE_URL unset the program starts a throwaway cluster, says so, runs, and
// deletes the cluster on exit: the README's first command.
func TestThrowawayCluster(t *testing.T) {
	bin := extest.Build(t)
	// --duration leaves room for a slow start on a loaded machine: a tick runs as long as
	// the replicas' pools are up before the last tick of the window.
	p := extest.Start(t, "cron", bin, []string{exampledb.EnvURL + "="}, "--every=500ms", "--duration=3s")
	require.Equal(t, 0, p.Wait(t, 20*time.Second))
	p.WaitLine(t, 0, "DATABASE_URL is not set", 0)
	p.WaitLine(t, 0, "running the job", 0)
	p.WaitLine(t, 0, "summary: ", 0)
	p.WaitLine(t, 0, "throwaway cluster stopped and deleted", 0)
}

// Ctrl-C stops the replicas and the throwaway cluster.
func TestInterruptStopsThrowawayCluster(t *testing.T) {
	bin := extest.Build(t)
	p := extest.Start(t, "cron", bin, []string{exampledb.EnvURL + "="}, "--every=300ms", "--duration=0")
	up := p.WaitLine(t, 0, "throwaway cluster up on ", 20*time.Second)
	addr := regexp.MustCompile(`127\.0\.0\.1:\d+`).FindString(p.Lines()[up])
	p.WaitLine(t, up, "running the job", 10*time.Second)

	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, 130, p.Wait(t, 20*time.Second))
	p.WaitLine(t, 0, "throwaway cluster stopped and deleted", 0)
	p.WaitLine(t, 0, "cron: interrupted", 0)
	_, err := net.DialTimeout("tcp", addr, time.Second)
	assert.Error(t, err, "the cluster at %s still accepts connections", addr)
}

// syncBuilder is a strings.Builder safe for the replicas' concurrent writes.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --metrics-addr serves the lock metrics while the replicas run: scraped just before the
// server stops, the acquisitions by result match the replicas' log, and nothing is left
// held or waiting.
func TestMetricsAddrServesLockMetrics(t *testing.T) {
	url := extest.DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out syncBuilder
	var body string
	cfg := config{URL: url, Replicas: 3, Name: "m", Every: 300 * time.Millisecond,
		JobTime: 20 * time.Millisecond, Duration: 1200 * time.Millisecond, MetricsAddr: "127.0.0.1:0",
		beforeMetricsStop: func(u string) {
			resp, err := http.Get(u)
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			body = string(b)
		}}
	require.NoError(t, run(ctx, cfg, &out))
	require.Contains(t, out.String(), "serving Prometheus metrics on http://127.0.0.1:")
	got, busy := strings.Count(out.String(), "  got the lock"), strings.Count(out.String(), "skipped: another replica holds the lock")
	require.Positive(t, got)
	const labels = `mode="exclusive",namespace="cron",`
	assert.Contains(t, body, fmt.Sprintf(`pgxlock_acquisitions_total{%sresult="acquired",scope="session"} %d`+"\n", labels, got))
	if busy > 0 {
		assert.Contains(t, body, fmt.Sprintf(`pgxlock_acquisitions_total{%sresult="busy",scope="session"} %d`+"\n", labels, busy))
	}
	assert.Contains(t, body, fmt.Sprintf(`pgxlock_hold_seconds_count{%sscope="session"} %d`+"\n", labels, got))
	assert.Contains(t, body, `pgxlock_held{`+labels+`scope="session"} 0`+"\n")
	assert.Contains(t, body, `pgxlock_waiting{`+labels+`scope="session"} 0`+"\n")
}
