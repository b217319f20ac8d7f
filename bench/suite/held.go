package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Held locks against connections (issue 22): the "held" section. A held lock
// (a TryLock handle) pins a pooled connection and a server backend of its own
// with advisory.Config{DisableMultiplexing: true} ("dedicated"); with the
// Config default ("multiplexed") held locks share holder connections once the
// advisory package multiplexes them. Before that lands the two modes behave
// alike, and the section's multiplexed rows show the dedicated numbers. Four
// workloads, both modes in each:
//
//   - points (this file): one process takes H TryLock handles on distinct
//     keys, one after another, H = 1, 10, 100, 1000, and holds them all; with
//     a pool of 10 in both modes, and in the dedicated mode also with a pool
//     of H+2 (capped by what the server has to give) so that it can succeed.
//     Counted while all are held: the Locker's backends in pg_stat_activity
//     (each pool has its own application_name), the backends that hold
//     advisory locks, the pool's AcquiredConns, the lock-table entries; and
//     where the dedicated form stops (the first TryLock to fail, with
//     ErrNoConnection when the pool is exhausted);
//   - processes (held_procs.go): 1,000 keys spread over 8 processes, a pool
//     of 10 each; the most backends one process has;
//   - try+unlock: paired TryLock+Unlock cycles, uncontended, dedicated
//     against multiplexed, alone and with 10 other keys held by the Locker;
//   - hand-off: Lock on a key held by another Locker (each holding other
//     keys too), dedicated against multiplexed: from the holder's Unlock to
//     the waiter's grant.

// Modes of a held-locks Locker.
const (
	modeDedicated   = "dedicated"
	modeMultiplexed = "multiplexed"
)

// heldConfig is the Locker Config of mode.
func heldConfig(mode string) advisory.Config {
	return advisory.Config{DisableMultiplexing: mode == modeDedicated}
}

// HeldResults is the held section of a run.
type HeldResults struct {
	Points    []*HeldPoint         `json:"points"`
	Processes []*HeldProcsResult   `json:"processes"`
	TryUnlock []*UncontendedResult `json:"try_unlock"`
	Handoff   []*HeldHandoff       `json:"handoff"`
	LockTable *LockTable           `json:"lock_table,omitempty"`
	Plots     []string             `json:"plots"`
}

// HeldPoint is one process holding H TryLock handles at once.
type HeldPoint struct {
	Mode       string  `json:"mode"`
	Held       int     `json:"held_asked"` // H
	Pool       int     `json:"pool"`
	PoolNote   string  `json:"pool_note,omitempty"`
	Skipped    string  `json:"skipped,omitempty"`
	Got        int     `json:"held"`      // handles held at once
	FailedAt   int     `json:"failed_at"` // 1-based index of the first TryLock that failed; 0: none
	FirstError string  `json:"first_error,omitempty"`
	NoConn     bool    `json:"no_connection"` // that failure matches advisory.ErrNoConnection
	Backends   int     `json:"backends"`      // the pool's backends in pg_stat_activity while held
	Pinned     int     `json:"pinned"`        // of them, those holding advisory locks
	Acquired   int     `json:"acquired_conns"`
	Entries    int     `json:"lock_table_entries"`
	TakeMS     float64 `json:"take_ms"` // taking all of them, one after another (loaded machine: indicative)
	UnlockErrs int     `json:"unlock_errors"`
}

// HeldHandoff is the hand-off latency of one mode.
type HeldHandoff struct {
	Mode        string  `json:"mode"`
	Background  int     `json:"background_keys_held"`          // by each of the two Lockers
	Handoff     Dist    `json:"handoff"`                       // the holder's Unlock call to the waiter's Lock return
	Unlock      Dist    `json:"unlock"`                        // the holder's Unlock call
	PairedRatio float64 `json:"paired_ratio_vs_dedicated"`     // median of per-slice mean ratios
	PairedP50   float64 `json:"paired_p50_ratio_vs_dedicated"` // median of per-slice p50 ratios
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
}

// heldCounts are H of the points workload.
func (s *Suite) heldCounts() []int {
	if s.cfg.Quick {
		return []int{1, 10, 100}
	}
	return []int{1, 10, 100, 1000}
}

const (
	heldPool       = 10 // the pool of the "pool of 10" points and of each process
	heldBackground = 10 // keys the Locker holds during the try+unlock "held" rows and the hand-off
)

func (s *Suite) runHeld(ctx context.Context) error {
	if !s.want("held", "") && !s.want("held", "points") && !s.want("held", "processes") &&
		!s.want("held", "try") && !s.want("held", "handoff") {
		return nil
	}
	s.res.Held = &HeldResults{}
	mon, closeMon, err := newPool(ctx, &s.env, Spec{PoolSize: 2})
	if err != nil {
		return err
	}
	defer closeMon()
	lt, err := s.lockTable(ctx, mon)
	if err != nil {
		return err
	}
	s.res.Held.LockTable = lt
	for _, step := range []func(context.Context, *pgxpool.Pool) error{s.runHeldPoints, s.runHeldProcs, s.runHeldTryUnlock, s.runHeldHandoff} {
		if err := step(ctx, mon); err != nil {
			return err
		}
		if err := s.save(); err != nil {
			return err
		}
	}
	if s.cfg.Out != "" {
		files, err := drawHeldPlot(s.cfg.Out, s.res.Held)
		s.res.Held.Plots = files
		if err != nil {
			return fmt.Errorf("plots: %w", err)
		}
	}
	return s.save()
}

// connBudget is how many connections a dedicated point may open: on the
// suite's own cluster all but a margin, on a shared server half of what is free.
func (s *Suite) connBudget(ctx context.Context, mon *pgxpool.Pool) (int, error) {
	var maxConns, reserved, used int
	err := mon.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)`).
		Scan(&maxConns, &reserved, &used)
	if err != nil {
		return 0, err
	}
	free := maxConns - reserved - used
	if s.throwaway {
		return free - 10, nil
	}
	return free / 2, nil
}

func (s *Suite) runHeldPoints(ctx context.Context, mon *pgxpool.Pool) error {
	if !s.want("held", "points") {
		return nil
	}
	budget, err := s.connBudget(ctx, mon)
	if err != nil {
		return err
	}
	for hi, h := range s.heldCounts() {
		t0 := time.Now()
		type pt struct {
			mode string
			pool int
			note string
		}
		pts := []pt{{modeDedicated, heldPool, ""}, {modeMultiplexed, heldPool, ""}}
		if h+2 > heldPool {
			big := pt{modeDedicated, h + 2, ""}
			if big.pool > budget {
				big.pool = budget
				big.note = "capped: what the server has free"
			}
			pts = append(pts, big)
		}
		for pi, p := range pts {
			base := s.env.KeyBase + 2_000_000 + int64(hi)*100_000 + int64(pi)*10_000
			app := fmt.Sprintf("pgxlockbench-held-%s-%d-%d-%s", p.mode, h, p.pool, s.env.RunID)
			r, err := s.heldPoint(ctx, mon, p.mode, h, p.pool, base, app)
			if err != nil {
				return err
			}
			r.PoolNote = p.note
			s.res.Held.Points = append(s.res.Held.Points, r)
		}
		s.logf("held points: %d handles (%v)", h, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// heldPoolFor opens a pool of size connections whose backends carry app as
// their application_name.
func heldPoolFor(ctx context.Context, e *Env, size int, app string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.DSN)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(size)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, cfg)
}

// heldPoint takes h TryLock handles on keys base.. with a Locker in mode on a
// pool of size pool, stopping at the first failure, counts what they pin and
// releases them.
func (s *Suite) heldPoint(ctx context.Context, mon *pgxpool.Pool, mode string, h, pool int, base int64, app string) (*HeldPoint, error) {
	r := &HeldPoint{Mode: mode, Held: h, Pool: pool}
	p, err := heldPoolFor(ctx, &s.env, pool, app)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	l, err := advisory.New(p, heldConfig(mode))
	if err != nil {
		return nil, err
	}
	var hs []*advisory.Lock
	defer func() {
		for _, x := range hs {
			if err := x.Unlock(context.WithoutCancel(ctx)); err != nil {
				r.UnlockErrs++
			}
		}
	}()
	t0 := time.Now()
	for i := range h {
		x, err := l.TryLock(ctx, keys.Int64(base+int64(i)), nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.FailedAt, r.FirstError, r.NoConn = i+1, err.Error(), errors.Is(err, advisory.ErrNoConnection)
			break
		}
		hs = append(hs, x)
	}
	r.TakeMS = float64(time.Since(t0)) / 1e6
	r.Got = len(hs)
	r.Acquired = int(p.Stat().AcquiredConns())
	backends, pinned, entries, err := countApp(ctx, mon, app)
	if err != nil {
		return nil, err
	}
	r.Backends, r.Pinned, r.Entries = backends, pinned, entries
	return r, nil
}

// countApp counts the backends whose application_name is app, those of them
// that hold advisory locks, and the advisory locks they hold.
func countApp(ctx context.Context, mon *pgxpool.Pool, app string) (backends, pinned, entries int, err error) {
	err = mon.QueryRow(ctx, `SELECT count(DISTINCT a.pid), count(DISTINCT l.pid), count(l.pid)
		FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
		WHERE a.application_name = $1`, app).Scan(&backends, &pinned, &entries)
	return backends, pinned, entries, err
}

// The try+unlock rows: TryLock then Unlock of a handle, in each mode, on a
// Locker that holds nothing else ("alone") or heldBackground other keys.
func heldTryContender(mode string, background int, keyOffset int64) Contender {
	name := fmt.Sprintf("pgxlock TryLock+Unlock, %s", mode)
	if background > 0 {
		name += fmt.Sprintf(", %d keys held", background)
	} else {
		name += ", alone"
	}
	return Contender{Name: name, Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			s.PoolSize = max(s.PoolSize, background+2)
			l, closeFn, err := newLocker(ctx, e, s, heldConfig(mode))
			if err != nil {
				return nil, err
			}
			var bg []*advisory.Lock
			release := func() {
				for _, h := range bg {
					_ = h.Unlock(context.WithoutCancel(ctx))
				}
				closeFn()
			}
			for i := range background {
				h, err := l.TryLock(ctx, keys.Int64(e.KeyBase+3_000_000+keyOffset+int64(i)), nil)
				if err != nil {
					release()
					return nil, fmt.Errorf("background key %d: %w", i, err)
				}
				bg = append(bg, h)
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				h, err := l.TryLock(ctx, keys.Int64(ks[0]), nil)
				if errors.Is(err, advisory.ErrNotAcquired) {
					return errBusy
				}
				if err != nil {
					return err
				}
				call(fn)
				return h.Unlock(ctx)
			}, release), nil
		}}
}

func heldTryGroup() ucGroup {
	one := func(c Contender) ucRow { return ucRow{C: c, NKeys: 1} }
	d := heldTryContender(modeDedicated, 0, 0)
	return ucGroup{Name: "held: TryLock+Unlock (handle)", Baseline: d.Name, Rows: []ucRow{
		one(d), one(heldTryContender(modeMultiplexed, 0, 100)),
		one(heldTryContender(modeDedicated, heldBackground, 200)), one(heldTryContender(modeMultiplexed, heldBackground, 300)),
	}}
}

func (s *Suite) runHeldTryUnlock(ctx context.Context, _ *pgxpool.Pool) error {
	if !s.want("held", "try") {
		return nil
	}
	t0 := time.Now()
	res, err := s.measureUncontended(ctx, 60, heldTryGroup())
	s.res.Held.TryUnlock = res
	s.logf("held try+unlock (%v)", time.Since(t0).Round(time.Millisecond))
	return err
}

// runHeldHandoff: two Lockers in one mode, each on its own pool and holding
// heldBackground other keys (two replicas whose holders share connections
// when multiplexed); one holds key K (Lock), the other calls Lock(K) and, once
// pg_locks shows it waiting on the server, the holder unlocks. The hand-off is
// from the Unlock call to the waiter's return; the waiter is the next holder,
// and the Lockers swap roles. Across Lockers the waiter always waits on the
// server, whatever a Locker does with its own waiters (its local queue, or
// issue 22's holder connections). The modes alternate in slices of n
// hand-offs.
func (s *Suite) runHeldHandoff(ctx context.Context, mon *pgxpool.Pool) error {
	if !s.want("held", "handoff") {
		return nil
	}
	t0 := time.Now()
	rounds, n := 8, 50
	if s.cfg.Quick {
		rounds, n = 2, 10
	}
	type run struct {
		res    *HeldHandoff
		ls     [2]*advisory.Locker
		bg     []*advisory.Lock
		h      *advisory.Lock // held by ls[cur]
		cur    int
		key    int64
		hand   []time.Duration
		unl    []time.Duration
		rounds []float64 // mean hand-off per slice
		p50s   []float64 // p50 hand-off per slice
	}
	var (
		runs   []*run
		closes []func()
	)
	defer func() { // the handles first: a pool's Close waits for its acquired connections
		for _, r := range runs {
			if r.h != nil {
				_ = r.h.Unlock(context.WithoutCancel(ctx))
			}
			for _, b := range r.bg {
				_ = b.Unlock(context.WithoutCancel(ctx))
			}
		}
		for _, c := range closes {
			c()
		}
	}()
	for mi, mode := range []string{modeDedicated, modeMultiplexed} {
		r := &run{res: &HeldHandoff{Mode: mode, Background: heldBackground}, key: s.env.KeyBase + 3_500_000 + int64(mi)*1000}
		runs = append(runs, r)
		s.res.Held.Handoff = append(s.res.Held.Handoff, r.res)
		for li := range r.ls {
			l, closeFn, err := newLocker(ctx, &s.env, Spec{PoolSize: heldBackground + 4}, heldConfig(mode))
			if err != nil {
				return err
			}
			closes = append(closes, closeFn)
			r.ls[li] = l
			for i := range heldBackground {
				b, err := l.TryLock(ctx, keys.Int64(r.key+1+int64(li*heldBackground+i)), nil)
				if err != nil {
					return fmt.Errorf("hand-off %s: background key: %w", mode, err)
				}
				r.bg = append(r.bg, b)
			}
		}
		var err error
		if r.h, err = r.ls[0].Lock(ctx, keys.Int64(r.key), nil); err != nil {
			return fmt.Errorf("hand-off %s: %w", mode, err)
		}
	}
	type granted struct {
		h   *advisory.Lock
		at  time.Time
		err error
	}
	k := func(r *run) keys.Key { return keys.Int64(r.key) }
	for round := range rounds {
		for i := range runs {
			r := runs[i]
			if round%2 == 1 {
				r = runs[len(runs)-1-i]
			}
			n0 := len(r.hand)
			for range n {
				waiter := r.ls[1-r.cur]
				ch := make(chan granted, 1)
				go func() { // owned: received below on every path
					h, err := waiter.Lock(ctx, k(r), nil)
					ch <- granted{h, time.Now(), err}
				}()
				if err := waitServerWaiter(ctx, mon, k(r)); err != nil {
					_ = r.h.Unlock(context.WithoutCancel(ctx)) // let the waiter through before giving up
					g := <-ch
					r.h, r.cur = g.h, 1-r.cur
					return err
				}
				u0 := time.Now()
				uerr := r.h.Unlock(ctx)
				u1 := time.Now()
				g := <-ch
				r.h, r.cur = g.h, 1-r.cur
				if g.err != nil {
					return fmt.Errorf("hand-off %s: %w", r.res.Mode, g.err)
				}
				if uerr != nil {
					r.res.Errors++
					if r.res.FirstError == "" {
						r.res.FirstError = uerr.Error()
					}
					continue
				}
				d := g.at.Sub(u0)
				r.hand = append(r.hand, d)
				r.unl = append(r.unl, u1.Sub(u0))
			}
			if len(r.hand) > n0 {
				d := summarize(r.hand[n0:])
				r.rounds, r.p50s = append(r.rounds, d.Mean), append(r.p50s, d.P50)
			}
		}
	}
	for _, r := range runs {
		r.res.Handoff = summarize(r.hand)
		r.res.Unlock = summarize(r.unl)
		r.res.PairedRatio = pairedRatio(r.rounds, runs[0].rounds)
		r.res.PairedP50 = pairedRatio(r.p50s, runs[0].p50s)
	}
	s.logf("held hand-off (%v)", time.Since(t0).Round(time.Millisecond))
	return nil
}

// waitServerWaiter returns once pg_locks shows a session waiting for k.
func waitServerWaiter(ctx context.Context, mon *pgxpool.Pool, k keys.Key) error {
	c, o, sub := k.PgLocks()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var n int
		if err := mon.QueryRow(wctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3`, c, o, sub).Scan(&n); err != nil {
			return fmt.Errorf("hand-off: waiting for the waiter: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("hand-off: the waiter never waited on the server: %w", wctx.Err())
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// heldMarkdown renders the held section.
func heldMarkdown(b *strings.Builder, h *HeldResults) {
	if h == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Held locks against connections (issue 22)\n\n")
	p("dedicated: `advisory.Config{DisableMultiplexing: true}`, a pooled connection per held lock; multiplexed: the Config default " +
		"(held locks share holder connections once the advisory package multiplexes; before that it behaves as dedicated).\n")
	if lt := h.LockTable; lt != nil {
		p("\nEvery held key is one lock-table entry whichever connection holds it: %s.\n", lt.Note)
	}
	if len(h.Points) > 0 {
		p("\n### One process holding H TryLock handles on distinct keys\n\n")
		p("| H | mode | pool | held | first failure | backends | holding locks | AcquiredConns | lock-table entries | take all | unlock errors |\n")
		p("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range h.Points {
			fail := "-"
			if r.FailedAt > 0 {
				fail = fmt.Sprintf("#%d: %s", r.FailedAt, oneLine(r.FirstError))
				if r.NoConn {
					fail = fmt.Sprintf("#%d: ErrNoConnection", r.FailedAt)
				}
			}
			pool := fmt.Sprint(r.Pool)
			if r.PoolNote != "" {
				pool += " (" + r.PoolNote + ")"
			}
			p("| %d | %s | %s | %d | %s | %d | %d | %d | %d | %.0f ms | %d |\n", r.Held, r.Mode, pool, r.Got, fail,
				r.Backends, r.Pinned, r.Acquired, r.Entries, r.TakeMS, r.UnlockErrs)
		}
	}
	if len(h.Processes) > 0 {
		p("\n### Keys spread over processes\n\n")
		p("| mode | processes x keys | pool each | held (all) | most backends in one process | most holding locks in one process | backends (all) | failures | per-process held |\n")
		p("|---|---|---:|---:|---:|---:|---:|---|---|\n")
		for _, r := range h.Processes {
			if r.Unavailable != "" {
				p("| %s | %d x %d | %d | unavailable: %s |||||\n", r.Mode, r.Procs, r.KeysPerProc, r.Pool, oneLine(r.Unavailable))
				continue
			}
			p("| %s | %d x %d | %d | %d | %d | %d | %d | %d (%s) | %v |\n", r.Mode, r.Procs, r.KeysPerProc, r.Pool, r.Held,
				r.MaxBackends, r.MaxPinned, r.Backends, r.Failed, oneLine(r.FirstError), r.HeldPerProc)
		}
	}
	if len(h.TryUnlock) > 0 {
		p("\n### TryLock+Unlock uncontended (ratios against %s)\n\n", h.TryUnlock[0].Baseline)
		p("| contender | calls/s | mean | p50 | p99 | x mean (paired) | x p50 (paired) | x p50 | round trips | allocs | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range h.TryUnlock {
			if r.Unavailable != "" {
				p("| %s | unavailable: %s |||||||||\n", r.Row, oneLine(r.Unavailable))
				continue
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %.2f | %.0f | %d |\n", r.Row, r.OpsPerSec, fmtUS(r.Lat.Mean), fmtUS(r.Lat.P50),
				fmtUS(r.Lat.P99), fmtX(r.PairedRatio), fmtX(r.PairedP50), fmtX(r.P50Ratio), r.RTPerOp, r.AllocsPerOp, r.Errors)
		}
		if t := h.TryUnlock; len(t) == 4 && t[2].PairedRatio > 0 && t[2].PairedP50 > 0 {
			p("\nMultiplexed against dedicated (paired mean; paired p50): alone %s; %s, with %d keys held %s; %s.\n",
				fmtX(t[1].PairedRatio), fmtX(t[1].PairedP50), heldBackground, fmtX(t[3].PairedRatio/t[2].PairedRatio), fmtX(t[3].PairedP50/t[2].PairedP50))
		}
	}
	if len(h.Handoff) > 0 {
		p("\n### Lock on a busy key: hand-off between two Lockers (replicas), each holding %d other keys\n\n", heldBackground)
		p("| mode | hand-offs | hand-off mean | p50 | p99 | x mean (paired) | x p50 (paired) | holder's Unlock p50 | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range h.Handoff {
			p("| %s | %d | %s | %s | %s | %s | %s | %s | %d |\n", r.Mode, r.Handoff.N, fmtUS(r.Handoff.Mean), fmtUS(r.Handoff.P50),
				fmtUS(r.Handoff.P99), fmtX(r.PairedRatio), fmtX(r.PairedP50), fmtUS(r.Unlock.P50), r.Errors)
		}
	}
	for _, f := range h.Plots {
		p("\n![%s](%s)\n", f, f)
	}
}
