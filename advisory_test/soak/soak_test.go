package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) {
	if raw := os.Getenv(workerEnv); raw != "" {
		os.Exit(worker(raw)) // this test binary, re-executed as a worker process
	}
	pgtest.Main(m)
}

// A short soak with every fault kind the database allows: it stops by itself, each
// enabled kind was injected at least once, and the merged history of 3 processes is
// linearizable. With PGXLOCK_TEST_DATABASE it runs against that server (-dsn: no restart,
// no failover); without, on a throwaway primary and standby of its own, with restart and
// failover too. Its workers hold every lock on a connection of its own
// (DisableMultiplexing), the soak's mode before issue 22.
func TestSoakShort(t *testing.T) { soakShort(t, muxOff) }

// TestSoakShort with multiplexing on (-multiplexing on): the workers' Lockers are built
// with the Config default, so their handles and Holds share holder connections (once
// the advisory package multiplexes; until then it runs as TestSoakShort does).
func TestSoakShortMultiplexed(t *testing.T) { soakShort(t, muxOn) }

func soakShort(t *testing.T, mux muxMode) {
	cfg := defaultConfig()
	cfg.Procs, cfg.Goroutines, cfg.Duration, cfg.MinEach = 3, 4, 4*time.Second, 1
	cfg.FaultEvery, cfg.Report = 300*time.Millisecond, 2*time.Second
	cfg.CheckLimit, cfg.OpTimeout = 20*time.Second, 5*time.Second
	cfg.Standby = true
	cfg.Mux = mux
	want := []string{faultTerminate, faultCancel, faultNetcut, faultRestart, faultFailover}
	if os.Getenv("PGXLOCK_TEST_DATABASE") != "" {
		cfg.DSN, cfg.Standby = pgtest.DSN(t), false
		want = []string{faultTerminate, faultCancel, faultNetcut}
	}
	var out bytes.Buffer
	// Bounds the fault loop (MinEach keeps it going until every kind has hit); the
	// drain after it is bounded by OpTimeout plus the run's own margin.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	res, err := run(ctx, cfg, &out)
	t.Logf("soak output:\n%s", out.String())
	require.NoError(t, err)
	for _, kind := range want {
		assert.Positive(t, res.Faults[kind], "no %s fault injected", kind)
	}
	assert.Positive(t, res.Acquired)
	assert.Zero(t, res.Killed)
	assert.Equal(t, verdictOK, res.Verdict, "visualisation: %s", res.HTML)
}

// The -multiplexing flag: off by default (the mode of every earlier run), on for every
// worker, mixed for the even-numbered ones; anything else is refused.
func TestMultiplexingFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []bool // workers 0..3 multiplexed
	}{
		{nil, []bool{false, false, false, false}},
		{[]string{"-multiplexing", "off"}, []bool{false, false, false, false}},
		{[]string{"-multiplexing", "on"}, []bool{true, true, true, true}},
		{[]string{"-multiplexing", "mixed"}, []bool{true, false, true, false}},
	} {
		cfg := defaultConfig()
		fs := flag.NewFlagSet("soak", flag.ContinueOnError)
		cfg.flags(fs)
		require.NoError(t, fs.Parse(c.args))
		for i, want := range c.want {
			assert.Equal(t, want, cfg.Mux.multiplexed(i), "%v: worker %d", c.args, i)
		}
	}
	cfg := defaultConfig()
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.flags(fs)
	assert.Error(t, fs.Parse([]string{"-multiplexing", "yes"}))
}

// The check fails a history in which two clients held one key exclusively at once, and
// writes porcupine's visualisation where the run says.
func TestCheckRejectsOverlapAndWritesHTML(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "w0.jsonl")
	f, err := os.Create(journal)
	require.NoError(t, err)
	rec := history.NewRecorder("w0", f)
	a := rec.Begin(history.Op{Client: "w0.g0", Key: "1", Kind: history.Acquire})
	b := rec.Begin(history.Op{Client: "w0.g1", Key: "1", Kind: history.Acquire})
	a.End(history.OK, 0)
	b.End(history.OK, 0) // both hold it now
	rec.Begin(history.Op{Client: "w0.g0", Key: "1", Kind: history.Release}).End(history.OK, 0)
	rec.Begin(history.Op{Client: "w0.g1", Key: "1", Kind: history.Release}).End(history.OK, 0)
	require.NoError(t, errors.Join(rec.Err(), f.Close()))

	cfg := defaultConfig()
	cfg.HTML = filepath.Join(dir, "soak.html")
	res := &result{}
	require.NoError(t, check(cfg, []string{journal}, nil, res))
	assert.Equal(t, verdictFail, res.Verdict)
	assert.False(t, res.Linearizable())
	assert.Equal(t, cfg.HTML, res.HTML)
	st, err := os.Stat(cfg.HTML)
	require.NoError(t, err)
	assert.Positive(t, st.Size())
}
