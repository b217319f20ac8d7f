package suite

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
)

// How cost grows (issue 15, part 4): the "scaling" section, three
// workloads, each with a table and a PNG plot in the -out directory:
//
//   - processes (scaling_procs.go): 1, 2, 4, 8 OS processes contending;
//   - keys: 1, 100, 10,000 distinct keys held at once by one caller;
//   - pinned: unrelated queries through a pool of 10 while 1, 4, 16, 64
//     goroutines of the process wait on a held key.

// ScalingResults is the scaling section of a run.
type ScalingResults struct {
	Processes []*ProcResult   `json:"processes"`
	Keys      []*KeysResult   `json:"keys"`
	LockTable *LockTable      `json:"lock_table,omitempty"`
	Pinned    []*PinnedResult `json:"pinned"`
	Plots     []string        `json:"plots"`
}

// KeysResult is one contender taking N keys in one call.
type KeysResult struct {
	Keys        int     `json:"keys"`
	Row         string  `json:"row"`
	Impl        string  `json:"impl"`
	Skipped     string  `json:"skipped,omitempty"`
	Calls       int     `json:"calls"`
	Call        Dist    `json:"call"`             // one call: take N keys, empty section, release them
	PerKeyUS    float64 `json:"per_key_mean_us"`  // Call.Mean / N
	PairedRatio float64 `json:"paired_ratio_raw"` // per-call time against raw pgx's same scope (median of per-round ratios)
	Entries     int     `json:"lock_table_entries"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
}

// LockTable is the server's lock-table capacity, from its settings.
type LockTable struct {
	MaxLocksPerXact  int    `json:"max_locks_per_transaction"`
	MaxConnections   int    `json:"max_connections"`
	MaxPreparedXacts int    `json:"max_prepared_transactions"`
	Nominal          int    `json:"nominal"`          // max_locks_per_transaction * (max_connections + max_prepared_transactions)
	DefaultNominal   int    `json:"default_nominal"`  // the same with PostgreSQL's defaults: 64 * (100 + 0)
	DefaultMeasured  int    `json:"default_measured"` // where 53200 hit with default settings (ARCHITECTURE.md)
	Throwaway        bool   `json:"throwaway"`
	Note             string `json:"note"`
}

// PinnedResult is one point of the pinned-connections workload.
type PinnedResult struct {
	Waiters int `json:"waiters"`
	*UnrelatedResult
}

// keysCounts are the key counts of the keys workload; defaultMeasured is
// where ARCHITECTURE.md measured 53200 with default settings.
var keysCounts = []int{1, 100, 10000}

const (
	defaultMeasured = 12900
	maxKeysPerCall  = 10000
)

// runScaling runs the scaling section's three workloads and draws the plots.
func (s *Suite) runScaling(ctx context.Context) error {
	if !s.want("scaling", "") && !s.want("scaling", "processes") && !s.want("scaling", "keys") && !s.want("scaling", "pinned") {
		return nil
	}
	s.res.Scaling = &ScalingResults{}
	for _, step := range []func(context.Context) error{s.runProcesses, s.runKeys, s.runPinned} {
		if err := step(ctx); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if s.cfg.Out != "" {
		if err := os.MkdirAll(s.cfg.Out, 0o755); err != nil {
			return err
		}
		files, err := drawScalingPlots(s.cfg.Out, s.res.Scaling)
		s.res.Scaling.Plots = files
		if err != nil {
			return fmt.Errorf("plots: %w", err)
		}
	}
	return s.save()
}

// The keys workload's contenders: one caller takes all N keys in one call,
// as a per-tenant service's sweep (a job over every tenant, or a leader
// holding one lock per tenant) does; Config.MaxKeys raised to 10,000.
func keysContenders() []Contender {
	cfg := advisory.Config{MaxKeys: maxKeysPerCall}
	return []Contender{
		withLockAllContender(cfg),
		rawLockMany,
		withXactLockAllContender(cfg),
		rawXactPipelinedMany,
	}
}

// lockTable reads the server's lock-table settings.
func (s *Suite) lockTable(ctx context.Context, pool *pgxpool.Pool) (*LockTable, error) {
	lt := &LockTable{DefaultNominal: 64 * (100 + 0), DefaultMeasured: defaultMeasured, Throwaway: s.throwaway}
	err := pool.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int,
		current_setting('max_connections')::int, current_setting('max_prepared_transactions')::int`).
		Scan(&lt.MaxLocksPerXact, &lt.MaxConnections, &lt.MaxPreparedXacts)
	if err != nil {
		return nil, err
	}
	lt.Nominal = lt.MaxLocksPerXact * (lt.MaxConnections + lt.MaxPreparedXacts)
	lt.Note = fmt.Sprintf("53200 (out of shared memory) hits near %d entries with default settings (64 x (100 + 0) = %d nominal; "+
		"PostgreSQL sizes the lock hash for the nominal count and lets it grow into spare shared memory, measured ~%d in ARCHITECTURE.md); "+
		"this server: %d x (%d + %d) = %d nominal", lt.DefaultNominal, lt.DefaultNominal, lt.DefaultMeasured,
		lt.MaxLocksPerXact, lt.MaxConnections, lt.MaxPreparedXacts, lt.Nominal)
	return lt, nil
}

func (s *Suite) runKeys(ctx context.Context) error {
	if !s.want("scaling", "keys") {
		return nil
	}
	pool, closePool, err := newPool(ctx, &s.env, Spec{PoolSize: 2})
	if err != nil {
		return err
	}
	defer closePool()
	lt, err := s.lockTable(ctx, pool)
	if err != nil {
		return err
	}
	s.res.Scaling.LockTable = lt
	counts := keysCounts
	if s.cfg.Quick {
		counts = []int{1, 100}
	}
	for ni, n := range counts {
		t0 := time.Now()
		var skip string
		// A shared server's lock table is everyone's: take at most half
		// of its nominal size there (a throwaway cluster is ours).
		if !s.throwaway && n > lt.Nominal/2 {
			skip = fmt.Sprintf("skipped on a shared server: %d keys is over half its nominal lock table (%d)", n, lt.Nominal)
		}
		base := s.env.KeyBase + 1_000_000 + int64(ni)*100_000
		if err := s.keysPoint(ctx, pool, n, base, skip); err != nil {
			return err
		}
		s.logf("scaling keys: %d (%v)", n, time.Since(t0).Round(time.Millisecond))
	}
	return s.save()
}

type keysRun struct {
	c      Contender
	res    *KeysResult
	inst   *Instance
	op     Op
	calls  []time.Duration
	rounds []float64 // mean call time per round
}

// keysPoint runs every keys contender with n keys, interleaved.
func (s *Suite) keysPoint(ctx context.Context, mon *pgxpool.Pool, n int, base int64, skip string) error {
	var runs []*keysRun
	defer func() {
		for _, r := range runs {
			r.inst.Close()
		}
	}()
	ks := make([]int64, n)
	for i := range ks {
		ks[i] = base + int64(i)
	}
	for _, c := range keysContenders() {
		res := &KeysResult{Keys: n, Row: c.Name, Impl: c.Impl, Skipped: skip}
		s.res.Scaling.Keys = append(s.res.Scaling.Keys, res)
		if skip != "" {
			continue
		}
		inst, err := c.New(ctx, &s.env, Spec{PoolSize: 1})
		if err != nil {
			return err
		}
		op, err := inst.Worker(0)
		if err != nil {
			inst.Close()
			return err
		}
		r := &keysRun{c: c, res: res, inst: inst, op: op}
		runs = append(runs, r)
		// Count the lock-table entries once, while the keys are held.
		var cerr error
		err = op(ctx, ks, func() {
			cerr = mon.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
				AND ((classid::int8 << 32) | objid::int8) BETWEEN $1 AND $2`, ks[0], ks[len(ks)-1]).Scan(&res.Entries)
		})
		if err == nil {
			err = cerr
		}
		if err != nil {
			res.Errors++
			res.FirstError = err.Error()
		}
	}
	p := s.params
	for round := 0; round < p.skRounds; round++ {
		for i := range runs {
			r := runs[i]
			if round%2 == 1 {
				r = runs[len(runs)-1-i]
			}
			var sum time.Duration
			calls := 0
			end := time.Now().Add(p.skSlice)
			for calls == 0 || time.Now().Before(end) {
				t0 := time.Now()
				if err := r.op(ctx, ks, nil); err != nil {
					r.res.Errors++
					if r.res.FirstError == "" {
						r.res.FirstError = err.Error()
					}
					if ctx.Err() != nil {
						return ctx.Err()
					}
					break
				}
				d := time.Since(t0)
				r.calls = append(r.calls, d)
				sum += d
				calls++
			}
			if calls > 0 {
				r.rounds = append(r.rounds, float64(sum)/float64(calls))
			}
		}
	}
	raws := map[string]*keysRun{}
	for _, r := range runs {
		if r.c.Impl == "raw pgx" {
			raws[scopeOf(r.c.Name)] = r
		}
	}
	for _, r := range runs {
		r.res.Calls = len(r.calls)
		r.res.Call = summarize(r.calls)
		r.res.PerKeyUS = r.res.Call.Mean / float64(n)
		if raw := raws[scopeOf(r.c.Name)]; raw != nil {
			r.res.PairedRatio = pairedRatio(r.rounds, raw.rounds)
		}
	}
	return nil
}

// scopeOf tells a keys contender's scope from its name: its raw pgx
// counterpart is the one with the same scope.
func scopeOf(name string) string {
	if strings.Contains(name, "Xact") || strings.Contains(name, "BEGIN") {
		return "xact"
	}
	return "session"
}

// runPinned: a pool of 10 serves SELECT 1 from 8 goroutines while W
// goroutines of the same process wait on a key held by a connection
// outside the pool; W = 1, 4, 16, 64, pgxlock against raw pgx, against a
// queries-only baseline, interleaved.
func (s *Suite) runPinned(ctx context.Context) error {
	if !s.want("scaling", "pinned") {
		return nil
	}
	t0 := time.Now()
	lw, rw := pgxlockWithLock, rawLockUnlock
	scs := []*urScenario{{name: "baseline (queries only)"}}
	out := []*PinnedResult{{Waiters: 0}}
	for _, w := range []int{1, 4, 16, 64} {
		for _, c := range []*Contender{&lw, &rw} {
			scs = append(scs, &urScenario{name: fmt.Sprintf("%s: %d waiting on a held key", c.Impl, w), c: c, held: true, lockers: w})
			out = append(out, &PinnedResult{Waiters: w})
		}
	}
	err := s.measureUnrelated(ctx, scs, s.env.KeyBase+310000, s.params.pnRounds, s.params.pnSlice)
	for i, sc := range scs {
		out[i].UnrelatedResult = sc.res
	}
	s.res.Scaling.Pinned = out
	if err != nil {
		return err
	}
	s.logf("scaling pinned: pool %d, %d query goroutines, 1..64 waiters (%v)", unrelatedPool, unrelatedQueries, time.Since(t0).Round(time.Millisecond))
	return s.save()
}

// scalingMarkdown renders the scaling section.
func scalingMarkdown(b *strings.Builder, sc *ScalingResults) {
	if sc == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(sc.Processes) > 0 {
		p("\n## How cost grows: processes\n\n")
		p("P OS processes (children of the suite), each with its own pool of %d and %d goroutines looping lock, no work, unlock. "+
			"Hand-off across processes on one wall clock; cross: share of hand-offs whose previous holder was another process; "+
			"per-process min/max: acquisitions of the least and most served process.\n", procPool, procGoroutines)
		cfg := ProcConfig{}
		for _, r := range sc.Processes {
			if r.Config != cfg {
				cfg = r.Config
				p("\n### %s\n\n", cfg)
				p("| contender | acq/s | x raw (paired) | x raw | wait p50 | wait p99 | hand-off p50 | hand-off p99 | cross | per-process min/max | errors | violations |\n")
				p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			}
			if r.Unavailable != "" {
				p("| %s | unavailable: %s |||||||||||\n", r.Row, oneLine(r.Unavailable))
				continue
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %.0f%% | %d/%d (%.2f) | %d | %d |\n", r.Row, r.PerSec, fmtX(r.PairedRatio), fmtX(r.Ratio),
				fmtUS(r.Wait.P50), fmtUS(r.Wait.P99), fmtUS(r.Handoff.P50), fmtUS(r.Handoff.P99), 100*r.CrossHandoff,
				r.PerProcess.Min, r.PerProcess.Max, r.PerProcess.MinMax, r.Errors, r.Violations)
		}
	}
	if len(sc.Keys) > 0 {
		p("\n## How cost grows: keys held at once\n\n")
		p("One caller takes N distinct keys in one call (Config.MaxKeys %d), empty section, releases them; "+
			"entries: advisory rows in pg_locks while held.\n\n", maxKeysPerCall)
		if lt := sc.LockTable; lt != nil {
			p("Lock table: %s.\n\n", lt.Note)
		}
		p("| keys | contender | calls | call mean | call p50 | call p99 | per key | x raw (paired) | lock-table entries | errors |\n")
		p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range sc.Keys {
			if r.Skipped != "" {
				p("| %d | %s | %s |||||||\n", r.Keys, r.Row, r.Skipped)
				continue
			}
			p("| %d | %s | %d | %s | %s | %s | %s | %s | %d | %d |\n", r.Keys, r.Row, r.Calls, fmtUS(r.Call.Mean), fmtUS(r.Call.P50), fmtUS(r.Call.P99),
				fmtUS(r.PerKeyUS), fmtX(r.PairedRatio), r.Entries, r.Errors)
		}
	}
	if len(sc.Pinned) > 0 {
		p("\n## How cost grows: pinned connections\n\n")
		p("`SELECT 1` from %d goroutines through a pool of %d while W goroutines of the same process wait on a key held outside the pool.\n\n", unrelatedQueries, unrelatedPool)
		p("| waiters | scenario | queries/s | x baseline (paired) | x baseline | query p50 | query p99 | errors |\n|---:|---|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range sc.Pinned {
			// Zero queries is a result here (every connection pinned), not "no data".
			p("| %d | %s | %.0f | %.2fx | %.2fx | %s | %s | %d |\n", r.Waiters, r.Scenario, r.QPS, r.Paired, r.Ratio, fmtUS(r.Lat.P50), fmtUS(r.Lat.P99), r.Errors)
		}
	}
	for _, f := range sc.Plots {
		p("\n![%s](%s)\n", f, f)
	}
}
