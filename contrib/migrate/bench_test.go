package pgxlockmigrate_test

import (
	"sync"
	"testing"
	"time"

	pgxlockmigrate "github.com/pgxlock/pgxlock/contrib/migrate"
)

// BenchmarkUpRace: 8 replicas start together and run Up on 5 migrations,
// each replica on its own pool, once with the stock pgx/v5 driver's lock and
// once with this package's, alternating per iteration, on a fresh schema
// each time (the migrations table created beforehand, as after a first
// deployment) and each pool warm. Metrics: s/race for each, and stock/pgxlock.
//
//	go test -run '^$' -bench UpRace -benchtime 5x ./contrib/migrate
func BenchmarkUpRace(b *testing.B) {
	var ours, stock time.Duration
	for i := range b.N {
		if i%2 == 0 {
			ours += race(b, false)
			stock += race(b, true)
		} else {
			stock += race(b, true)
			ours += race(b, false)
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ours.Seconds()/float64(b.N), "s/race-pgxlock")
	b.ReportMetric(stock.Seconds()/float64(b.N), "s/race-stock")
	b.ReportMetric(stock.Seconds()/ours.Seconds(), "stock/pgxlock")
}

const raceReplicas = 8

func race(b *testing.B, stock bool) time.Duration {
	b.StopTimer()
	ctx := testCtx(b)
	f := newFixture(b, 5, 0)
	var rs []*replica
	for range raceReplicas {
		r := f.replica(b, ctx, stock, pgxlockmigrate.Config{})
		// A service's pool is warm: open a second connection beside the one
		// the stock driver keeps, so no replica connects inside the race.
		c, err := r.pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.Release()
		rs = append(rs, r)
	}
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	b.StartTimer()
	start := time.Now()
	for i, r := range rs {
		wg.Go(func() { errs[i] = r.m.Up() })
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	for i, err := range errs {
		if !isNoChange(err) {
			b.Fatalf("replica %d: %v", i, err)
		}
	}
	if got := f.counts(b); len(got) != 5 {
		b.Fatalf("applied %v, want each of 5 once", got)
	}
	return took
}
