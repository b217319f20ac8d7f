package suite

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/pgxlock/pgxlock/bench/internal/rt"
)

// Uncontended workloads: one goroutine, nothing else holds the key, each
// contender's cycle (acquire, empty critical section, release) timed call by
// call. The contenders of a group run interleaved in short slices (A B C,
// then C B A, ...) so that drift in the machine's speed hits all alike.

type ucRow struct {
	C     Contender
	NKeys int
}

type ucGroup struct {
	Name     string
	Baseline string // row label the ratios are taken against
	Leases   bool   // keys are row ids 1..leaseRows
	Rows     []ucRow
}

func (r ucRow) label() string {
	if r.NKeys > 1 {
		return fmt.Sprintf("%s (%d keys)", r.C.Name, r.NKeys)
	}
	return r.C.Name
}

// UncontendedResult is one row of an uncontended group.
type UncontendedResult struct {
	Group       string  `json:"group"`
	Row         string  `json:"row"`
	Impl        string  `json:"impl"`
	Peer        bool    `json:"peer"`
	Keys        int     `json:"keys"`
	Note        string  `json:"note,omitempty"`
	Unavailable string  `json:"unavailable,omitempty"`
	Ops         int     `json:"ops"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	Lat         Dist    `json:"latency"`
	RTPerOp     float64 `json:"round_trips_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	MeanRatio   float64 `json:"mean_ratio_vs_baseline"`
	P50Ratio    float64 `json:"p50_ratio_vs_baseline"`
	PairedRatio float64 `json:"paired_mean_ratio_vs_baseline"` // median of per-round mean ratios
	PairedP50   float64 `json:"paired_p50_ratio_vs_baseline"`  // median of per-round p50 ratios (less swayed by a loaded machine's outliers)
	P99Ratio    float64 `json:"p99_ratio_vs_baseline"`
	Baseline    string  `json:"baseline"`
}

func uncontendedGroups() []ucGroup {
	one := func(cs ...Contender) []ucRow {
		rows := make([]ucRow, len(cs))
		for i, c := range cs {
			rows[i] = ucRow{C: c, NKeys: 1}
		}
		return rows
	}
	return []ucGroup{
		{Name: "session lock+unlock", Baseline: rawLockUnlock.Name, Rows: one(
			pgxlockWithLock, rawLockUnlock, pgxlockLockHandle, rawLockUnlockAA, gooseSession, gooseTable,
			redislockObtain, redsyncLock, etcdLock)},
		{Name: "try+unlock", Baseline: rawTryUnlock.Name, Rows: one(
			pgxlockTryWithLock, rawTryUnlock, redislockTry, redsyncTry, etcdTry)},
		{Name: "xact helper", Baseline: rawXactPipelined.Name, Rows: one(
			pgxlockWithXactLock, rawXactPipelined, rawXactNaive, rawXactPipelinedAA)},
		{Name: "xact batch (3 writes)", Baseline: rawXactBatch3.Name, Rows: one( // batch.go
			pgxlockXactBatch3, rawXactBatch3, rawXactBatch3Reset, pgxlockWithXactLock3)},
		{Name: "multi-key session (10 keys)", Baseline: pgxlockWithLock.Name, Rows: []ucRow{
			{C: pgxlockWithLock, NKeys: 1}, {C: pgxlockWithLockAll, NKeys: 10},
			{C: rawLockUnlock, NKeys: 1}, {C: rawLockMany, NKeys: 10}}},
		{Name: "multi-key xact (10 keys)", Baseline: pgxlockWithXactLock.Name, Rows: []ucRow{
			{C: pgxlockWithXactLock, NKeys: 1}, {C: pgxlockWithXactLockAll, NKeys: 10},
			{C: rawXactPipelined, NKeys: 1}, {C: rawXactPipelinedMany, NKeys: 10}}},
		{Name: "lease acquire+release", Baseline: rawColumnLease.Name, Leases: true, Rows: one(
			pgxlockColumnLease, rawColumnLease, pgxlockManagerLease, rawManagerLease, gooseTable, redislockTry)},
	}
}

type ucRun struct {
	row     ucRow
	res     *UncontendedResult
	op      Op
	inst    *Instance
	counter *rt.Counter
	keys    []int64
	lat     []time.Duration
	busy    time.Duration
	rounds  []float64 // mean latency per round
	p50s    []float64 // p50 latency per round
}

func (s *Suite) runUncontended(ctx context.Context) error {
	for gi, g := range uncontendedGroups() {
		if !s.want("uncontended", g.Name) {
			continue
		}
		s.logf("uncontended: %s", g.Name)
		res, err := s.measureUncontended(ctx, gi, g)
		s.res.Uncontended = append(s.res.Uncontended, res...)
		if err != nil {
			return err
		}
		if err := s.save(); err != nil {
			return err
		}
	}
	return nil
}

// measureUncontended runs the rows of g interleaved and returns one result per
// row; gi places the group's keys (KeyBase + gi*1000).
func (s *Suite) measureUncontended(ctx context.Context, gi int, g ucGroup) ([]*UncontendedResult, error) {
	p := s.params
	var out []*UncontendedResult
	var runs []*ucRun
	for ri, row := range g.Rows {
		res := &UncontendedResult{Group: g.Name, Row: row.label(), Impl: row.C.Impl, Peer: row.C.Peer,
			Keys: row.NKeys, Note: row.C.Note, Baseline: g.Baseline}
		out = append(out, res)
		if ok, why := s.env.available(&row.C); !ok {
			res.Unavailable = why
			continue
		}
		r := &ucRun{row: row, res: res, counter: &rt.Counter{}}
		base := s.env.KeyBase + int64(gi*1000+ri*16)
		if g.Leases {
			base = int64(ri*16 + 1)
		}
		for j := 0; j < row.NKeys; j++ {
			r.keys = append(r.keys, base+int64(j))
		}
		inst, err := row.C.New(ctx, &s.env, Spec{PoolSize: 2, Counter: r.counter})
		if err == nil {
			r.inst = inst
			r.op, err = inst.Worker(0)
		}
		if err != nil {
			res.Unavailable = "set-up failed: " + err.Error()
			if r.inst != nil {
				r.inst.Close()
			}
			continue
		}
		runs = append(runs, r)
	}
	// Warm up: connections dialled, statements prepared, caches filled.
	for _, r := range runs {
		for i := 0; i < p.warmOps; i++ {
			r.call(ctx, false)
		}
		r.res.Errors, r.res.FirstError = 0, ""
	}
	for round := 0; round < p.ucRounds; round++ {
		for i := range runs {
			r := runs[i]
			if round%2 == 1 {
				r = runs[len(runs)-1-i]
			}
			end := time.Now().Add(p.ucSlice)
			t0 := time.Now()
			n0 := len(r.lat)
			for time.Now().Before(end) {
				r.call(ctx, true)
			}
			r.busy += time.Since(t0)
			d := summarize(r.lat[n0:])
			r.rounds, r.p50s = append(r.rounds, d.Mean), append(r.p50s, d.P50)
		}
	}
	for _, r := range runs {
		r.inst.Close()
	}
	// Counted pass: round trips and allocations per call, each row on
	// a fresh instance with every other one closed, so that no other
	// client's background work (keepalives, health checks) is counted.
	for _, r := range runs {
		if err := r.count(ctx, &s.env, p); err != nil {
			r.res.Errors++
			if r.res.FirstError == "" {
				r.res.FirstError = err.Error()
			}
		}
	}
	var baseline *UncontendedResult
	for _, r := range runs {
		r.res.Ops = len(r.lat)
		r.res.Lat = summarize(r.lat)
		if r.busy > 0 {
			r.res.OpsPerSec = float64(len(r.lat)) / r.busy.Seconds()
		}
		if r.res.Row == g.Baseline {
			baseline = r.res
		}
	}
	if baseline != nil {
		var base, baseP50 []float64
		for _, r := range runs {
			if r.res == baseline {
				base, baseP50 = r.rounds, r.p50s
			}
		}
		for _, r := range runs {
			r.res.PairedRatio = pairedRatio(r.rounds, base)
			r.res.PairedP50 = pairedRatio(r.p50s, baseP50)
			r.res.MeanRatio = ratio(r.res.Lat.Mean, baseline.Lat.Mean)
			r.res.P50Ratio = ratio(r.res.Lat.P50, baseline.Lat.P50)
			r.res.P99Ratio = ratio(r.res.Lat.P99, baseline.Lat.P99)
		}
	}
	return out, ctx.Err()
}

func (r *ucRun) call(ctx context.Context, record bool) {
	t0 := time.Now()
	err := r.op(ctx, r.keys, nil)
	d := time.Since(t0)
	if err != nil {
		r.res.Errors++
		if r.res.FirstError == "" {
			r.res.FirstError = err.Error()
		}
		return
	}
	if record {
		r.lat = append(r.lat, d)
	}
}

// count measures round trips and allocations per call on a fresh instance.
func (r *ucRun) count(ctx context.Context, e *Env, p params) error {
	inst, err := r.row.C.New(ctx, e, Spec{PoolSize: 2, Counter: r.counter})
	if err != nil {
		return err
	}
	defer inst.Close()
	op, err := inst.Worker(0)
	if err != nil {
		return err
	}
	for i := 0; i < p.warmOps; i++ {
		if err := op(ctx, r.keys, nil); err != nil {
			return err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	r.counter.Reset()
	runtime.ReadMemStats(&m0)
	for i := 0; i < p.countOps; i++ {
		if err := op(ctx, r.keys, nil); err != nil {
			return err
		}
	}
	runtime.ReadMemStats(&m1)
	n := float64(p.countOps)
	r.res.RTPerOp = float64(r.counter.Count()) / n
	r.res.AllocsPerOp = float64(m1.Mallocs-m0.Mallocs) / n
	r.res.BytesPerOp = float64(m1.TotalAlloc-m0.TotalAlloc) / n
	return nil
}
