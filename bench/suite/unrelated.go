package suite

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Unrelated-query throughput: the application's pool (10 connections) serves
// plain queries from 8 goroutines while 64 goroutines of the same process
// use a lock through the same pool. Scenarios, interleaved:
//
//   - baseline: queries only;
//   - held: a connection outside the pool holds the key for the whole slice,
//     so all 64 lock goroutines wait;
//   - churn: the 64 goroutines take the key in turn, 1 ms of work each.
//
// Raw pgx pins a connection per waiter, so the queries queue behind the
// waiters for the pool; the library's local wait queue lets only one of
// them wait on the server.

const (
	unrelatedPool    = 10
	unrelatedQueries = 8
	unrelatedLockers = 64
)

// UnrelatedResult is one scenario.
type UnrelatedResult struct {
	Scenario string  `json:"scenario"`
	Impl     string  `json:"impl"`
	Queries  int     `json:"queries"`
	Seconds  float64 `json:"seconds"`
	QPS      float64 `json:"qps"`
	Ratio    float64 `json:"ratio_vs_baseline"`
	Paired   float64 `json:"paired_ratio_vs_baseline"` // median of per-round ratios
	Lat      Dist    `json:"query_latency"`
	LockAcq  int     `json:"lock_acquisitions"`
	Errors   int     `json:"errors"`
}

type urScenario struct {
	name    string
	c       *Contender // nil: baseline
	held    bool
	lockers int // goroutines using the lock (c != nil)
	res     *UnrelatedResult
	inst    *Instance
	ops     []Op
	lat     []time.Duration
	count   int
	secs    float64
	rounds  []float64 // queries per second per round
}

func (s *Suite) runUnrelated(ctx context.Context) error {
	if !s.want("unrelated", "") {
		return nil
	}
	p := s.params
	s.logf("unrelated queries: pool %d, %d query goroutines, %d lock goroutines", unrelatedPool, unrelatedQueries, unrelatedLockers)
	lw, rw := pgxlockWithLock, rawLockUnlock
	scs := []*urScenario{
		{name: "baseline (queries only)"},
		{name: "pgxlock: 64 waiting on a held key", c: &lw, held: true, lockers: unrelatedLockers},
		{name: "raw pgx: 64 waiting on a held key", c: &rw, held: true, lockers: unrelatedLockers},
		{name: "pgxlock: 64 taking the key in turn (1 ms work)", c: &lw, lockers: unrelatedLockers},
		{name: "raw pgx: 64 taking the key in turn (1 ms work)", c: &rw, lockers: unrelatedLockers},
	}
	err := s.measureUnrelated(ctx, scs, s.env.KeyBase+300000, p.urRounds, p.urSlice)
	for _, sc := range scs {
		s.res.Unrelated = append(s.res.Unrelated, sc.res)
	}
	if err != nil {
		return err
	}
	return s.save()
}

// measureUnrelated runs the scenarios scs (the first is the queries-only
// baseline) on one pool of unrelatedPool connections, with a connection
// outside it to hold key: it builds each scenario's lock goroutines, warms
// the pool, runs rounds slices of each scenario interleaved (in reverse
// order every other round), and fills each sc.res, ratios to the baseline
// included. sc.res is set even when it fails part-way.
func (s *Suite) measureUnrelated(ctx context.Context, scs []*urScenario, key int64, rounds int, slice time.Duration) error {
	for _, sc := range scs {
		impl := "-"
		if sc.c != nil {
			impl = sc.c.Impl
		}
		sc.res = &UnrelatedResult{Scenario: sc.name, Impl: impl}
	}
	pool, closePool, err := newPool(ctx, &s.env, Spec{PoolSize: unrelatedPool})
	if err != nil {
		return err
	}
	defer closePool()
	holder, err := pgx.Connect(ctx, s.env.DSN)
	if err != nil {
		return err
	}
	defer holder.Close(context.WithoutCancel(ctx))
	defer func() {
		for _, sc := range scs {
			if sc.inst != nil {
				sc.inst.Close()
			}
		}
	}()
	for _, sc := range scs {
		if sc.c == nil {
			continue
		}
		inst, err := sc.c.New(ctx, &s.env, Spec{Pool: pool})
		if err != nil {
			return err
		}
		sc.inst = inst
		for g := 0; g < sc.lockers; g++ {
			op, err := inst.Worker(g)
			if err != nil {
				return err
			}
			sc.ops = append(sc.ops, op)
		}
	}
	s.queryLoad(ctx, pool, 200*time.Millisecond) // warm the pool to its full size
	for round := 0; round < rounds; round++ {
		for i := range scs {
			sc := scs[i]
			if round%2 == 1 {
				sc = scs[len(scs)-1-i]
			}
			if err := s.unrelatedSlice(ctx, pool, holder, sc, key, slice); err != nil {
				return err
			}
		}
	}
	base := scs[0]
	for _, sc := range scs {
		sc.res.Queries = sc.count
		sc.res.Seconds = sc.secs
		sc.res.QPS = ratio(float64(sc.count), sc.secs)
		sc.res.Lat = summarize(sc.lat)
	}
	for _, sc := range scs {
		sc.res.Ratio = ratio(sc.res.QPS, base.res.QPS)
		sc.res.Paired = pairedRatio(sc.rounds, base.rounds)
	}
	return nil
}

func (s *Suite) unrelatedSlice(ctx context.Context, pool *pgxpool.Pool, holder *pgx.Conn, sc *urScenario, key int64, d time.Duration) error {
	var (
		stop         atomic.Bool
		wg           sync.WaitGroup
		acq          atomic.Int64
		errs         atomic.Int64
		lctx, cancel = context.WithCancel(ctx)
	)
	defer cancel()
	if sc.held {
		if _, err := holder.Exec(ctx, sqlLock, key); err != nil {
			return err
		}
	}
	work := time.Duration(0)
	if !sc.held {
		work = time.Millisecond
	}
	for _, op := range sc.ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := []int64{key}
			fn := func() {
				acq.Add(1)
				if work > 0 {
					time.Sleep(work)
				}
			}
			for !stop.Load() {
				if err := op(lctx, ks, fn); err != nil {
					if lctx.Err() != nil {
						return
					}
					errs.Add(1)
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	if len(sc.ops) > 0 {
		time.Sleep(50 * time.Millisecond) // let the waiters queue up
	}
	type load struct {
		n    int
		lat  []time.Duration
		secs float64
	}
	loaded := make(chan load, 1)
	go func() {
		n, lat, secs := s.queryLoad(ctx, pool, d)
		loaded <- load{n, lat, secs}
	}()
	time.Sleep(d)
	stop.Store(true)
	if sc.held {
		var ok bool
		if err := holder.QueryRow(ctx, sqlUnlock, key).Scan(&ok); err != nil {
			return err
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.params.grace):
		cancel()
		<-done
	}
	l := <-loaded
	sc.count += l.n
	sc.rounds = append(sc.rounds, ratio(float64(l.n), l.secs))
	sc.lat = append(sc.lat, l.lat...)
	sc.secs += l.secs
	sc.res.LockAcq += int(acq.Load())
	sc.res.Errors += int(errs.Load())
	return nil
}

// queryLoad runs unrelatedQueries goroutines of SELECT 1 through pool for d.
func (s *Suite) queryLoad(ctx context.Context, pool *pgxpool.Pool, d time.Duration) (int, []time.Duration, float64) {
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		n   int
		all []time.Duration
	)
	t0 := time.Now()
	end := t0.Add(d)
	qctx, cancel := context.WithDeadline(ctx, end.Add(s.params.grace))
	defer cancel()
	for q := 0; q < unrelatedQueries; q++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for {
				a := time.Now()
				if !a.Before(end) {
					break
				}
				var one int
				if err := pool.QueryRow(qctx, "SELECT 1").Scan(&one); err != nil {
					break
				}
				if time.Now().Before(end) {
					lat = append(lat, time.Since(a))
				}
			}
			mu.Lock()
			n += len(lat)
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return n, all, d.Seconds()
}
