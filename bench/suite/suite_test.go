package suite

import (
	"github.com/pgxlock/pgxlock/bench/internal/rt"

	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestQuickSmoke runs the quick mode of a few workloads against the database
// (DATABASE_URL or a throwaway cluster) and checks what must hold whatever
// the machine's speed: exact round trips, no errors, mutual exclusion, and
// that the library keeps the application's pool usable while 64 goroutines
// wait. Peers run when their servers are there and are skipped otherwise.
func TestQuickSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Quick: true,
		Only: []string{"uncontended:session", "uncontended:xact helper", "uncontended:xact batch", "uncontended:lease",
			"contention:1 key(s), 32 goroutines, pool 10", "unrelated"},
		Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantRT := map[string]float64{
		pgxlockWithLock.Name: 2, rawLockUnlock.Name: 2, pgxlockWithXactLock.Name: 2,
		rawXactPipelined.Name: 2, rawXactNaive.Name: 3, pgxlockColumnLease.Name: 2, pgxlockManagerLease.Name: 2,
		pgxlockXactBatch3.Name: 1, rawXactBatch3.Name: 1, rawXactBatch3Reset.Name: 1, pgxlockWithXactLock3.Name: 5,
	}
	seen := 0
	for _, r := range res.Uncontended {
		if r.Unavailable != "" {
			if !r.Peer {
				t.Errorf("%s / %s unavailable: %s", r.Group, r.Row, r.Unavailable)
			}
			t.Logf("%s / %s: %s", r.Group, r.Row, r.Unavailable)
			continue
		}
		if r.Errors > 0 || r.Ops == 0 {
			t.Errorf("%s / %s: %d ops, %d errors (%s)", r.Group, r.Row, r.Ops, r.Errors, r.FirstError)
		}
		if want, ok := wantRT[r.Row]; ok {
			seen++
			if r.RTPerOp != want {
				t.Errorf("%s / %s: %.2f round trips per call, want %.0f", r.Group, r.Row, r.RTPerOp, want)
			}
		}
	}
	if seen < 6 {
		t.Errorf("only %d of the round-trip checks ran", seen)
	}
	for _, r := range res.Contention {
		if r.Unavailable != "" {
			continue
		}
		if r.Violations != 0 {
			t.Errorf("%s %s: %d mutual-exclusion violations", r.Config, r.Row, r.Violations)
		}
		if r.Errors != 0 {
			t.Errorf("%s %s: %d errors (%s)", r.Config, r.Row, r.Errors, r.FirstError)
		}
		if !r.Peer && r.Acquisitions == 0 {
			t.Errorf("%s %s: no acquisitions", r.Config, r.Row)
		}
	}
	var lib, raw float64
	for _, r := range res.Unrelated {
		if strings.Contains(r.Scenario, "held key") {
			switch r.Impl {
			case "pgxlock":
				lib = r.Ratio
			case "raw pgx":
				raw = r.Ratio
			}
		}
	}
	// Structural, not a timing: raw pgx pins all 10 connections with
	// waiters, the library one. Loose bounds for a busy CI machine.
	if lib < 0.5 || raw > 0.5 || lib <= raw {
		t.Errorf("unrelated queries while 64 goroutines wait on a held key: pgxlock %.2fx, raw %.2fx of baseline", lib, raw)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Benchmarks of single contenders, for profiling one cycle:
//
//	go test -run '^$' -bench 'Cycle/pgxlock_WithLock$' -benchmem -memprofile mem.out ./suite
var (
	benchOnce  sync.Once
	benchSuite *Suite
	benchStop  func()
	benchErr   error
)

func TestMain(m *testing.M) {
	ChildMain()
	code := m.Run()
	if benchStop != nil {
		benchStop()
	}
	os.Exit(code)
}

func BenchmarkCycle(b *testing.B) {
	benchOnce.Do(func() {
		benchSuite = newSuite(Config{NoPeers: true})
		benchStop, benchErr = benchSuite.start(context.Background())
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	// A cancellable context, as an application's request context is: pgx
	// watches it during every query (context.Background is not watched).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, c := range []Contender{pgxlockWithLock, rawLockUnlock, pgxlockTryWithLock, rawTryUnlock,
		pgxlockWithXactLock, rawXactPipelined, pgxlockColumnLease, rawColumnLease, pgxlockManagerLease, rawManagerLease} {
		b.Run(strings.ReplaceAll(c.Name, " ", "_"), func(b *testing.B) {
			inst, err := c.New(ctx, &benchSuite.env, Spec{PoolSize: 2, Counter: benchCounter()})
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Close()
			op, err := inst.Worker(0)
			if err != nil {
				b.Fatal(err)
			}
			ks := []int64{benchSuite.env.KeyBase + 500000 + int64(i)}
			if strings.Contains(c.Name, "lease") || strings.Contains(c.Name, "column") || strings.Contains(c.Name, "lock-manager") {
				ks[0] = int64(900 + i)
			}
			for range 20 {
				_ = op(ctx, ks, nil)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := op(ctx, ks, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchCounter returns a round-trip counter when BENCH_COUNT_RT is set, to
// check that counting costs nothing measurable.
func benchCounter() *rt.Counter {
	if os.Getenv("BENCH_COUNT_RT") != "" {
		return &rt.Counter{}
	}
	return nil
}
