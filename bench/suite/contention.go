package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgxlock/pgxlock/bench/internal/rt"
)

// Contended workloads: G goroutines of one process loop acquire, work,
// release on one key or on a key drawn at random from 16. Measured per
// acquisition, on the monotonic clock:
//
//   - wait: from the call to the start of the critical section (pool, local
//     queue and server wait included);
//   - hand-off: from the end of the previous holder's critical section (the
//     moment its release starts) to the start of the next one's, counted
//     only when the next holder was already waiting then;
//   - per-goroutine acquisitions, and mutual-exclusion violations (two
//     holders of one key at once: must be 0).
//
// Contenders alternate in slices; only acquisitions whose critical section
// starts inside a slice's window count.

// ContentionConfig is one point of the contention matrix.
type ContentionConfig struct {
	Keys       int           `json:"keys"`
	Goroutines int           `json:"goroutines"`
	Pool       int           `json:"pool"`
	Work       time.Duration `json:"work_ns"`
}

func (c ContentionConfig) String() string {
	w := "no work"
	if c.Work > 0 {
		w = c.Work.String() + " work"
	}
	return fmt.Sprintf("%d key(s), %d goroutines, pool %d, %s", c.Keys, c.Goroutines, c.Pool, w)
}

// ContentionResult is one contender at one configuration.
type ContentionResult struct {
	Section      string           `json:"section"`
	Config       ContentionConfig `json:"config"`
	Row          string           `json:"row"`
	Impl         string           `json:"impl"`
	Peer         bool             `json:"peer"`
	Note         string           `json:"note,omitempty"`
	Unavailable  string           `json:"unavailable,omitempty"`
	Acquisitions int              `json:"acquisitions"`
	Seconds      float64          `json:"seconds"`
	PerSec       float64          `json:"acq_per_sec"`
	Ratio        float64          `json:"throughput_ratio_vs_raw"`
	PairedRatio  float64          `json:"paired_throughput_ratio_vs_raw"` // median of per-round ratios
	Wait         Dist             `json:"wait"`
	Handoff      Dist             `json:"handoff"`
	PerGoroutine Spread           `json:"per_goroutine"`
	Counts       []int            `json:"counts_per_goroutine,omitempty"`
	Errors       int              `json:"errors"`
	FirstError   string           `json:"first_error,omitempty"`
	Violations   int64            `json:"violations"`
	HardStops    int              `json:"hard_stops"`
}

func contentionContenders() []Contender {
	return []Contender{pgxlockWithLock, rawLockUnlock, gooseSession, gooseTable, redislockObtain, redsyncLock, etcdLock}
}

func contentionMatrix() []ContentionConfig {
	var out []ContentionConfig
	for _, k := range []int{1, 16} {
		for _, pool := range []int{10, 50} {
			for _, g := range []int{8, 32, 64} {
				out = append(out, ContentionConfig{Keys: k, Goroutines: g, Pool: pool})
			}
		}
	}
	return out
}

type ctRun struct {
	c       Contender
	res     *ContentionResult
	inst    *Instance
	workers []Op
	counts  []int
	waits   []time.Duration
	hand    []time.Duration
	secs    float64
	rounds  []float64 // acquisitions per second per round
}

func (s *Suite) runContention(ctx context.Context) error {
	p := s.params
	for ci, cfg := range contentionMatrix() {
		if !s.want("contention", cfg.String()) {
			continue
		}
		t0 := time.Now()
		base := s.env.KeyBase + 100000 + int64(ci*100)
		if err := s.contend(ctx, "contention", cfg, contentionContenders(), base, p.ctRounds, p.ctSlice, false); err != nil {
			return err
		}
		s.logf("contention: %s (%v)", cfg, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

func (s *Suite) runFairness(ctx context.Context) error {
	if !s.want("fairness", "") {
		return nil
	}
	cfg := ContentionConfig{Keys: 1, Goroutines: 32, Pool: 50, Work: time.Millisecond}
	s.logf("fairness: %s, %v per contender", cfg, time.Duration(s.params.fairSlices)*s.params.fairSlice)
	return s.contend(ctx, "fairness", cfg, contentionContenders(), s.env.KeyBase+200000, s.params.fairSlices, s.params.fairSlice, true)
}

// contend runs every contender at cfg, interleaved, and records the results.
func (s *Suite) contend(ctx context.Context, section string, cfg ContentionConfig, cs []Contender, base int64, rounds int, slice time.Duration, keepCounts bool) error {
	var runs []*ctRun
	for i, c := range cs {
		res := &ContentionResult{Section: section, Config: cfg, Row: c.Name, Impl: c.Impl, Peer: c.Peer, Note: c.Note}
		s.res.Contention = append(s.res.Contention, res)
		if ok, why := s.env.available(&c); !ok {
			res.Unavailable = why
			continue
		}
		r := &ctRun{c: c, res: res, counts: make([]int, cfg.Goroutines)}
		inst, err := c.New(ctx, &s.env, Spec{PoolSize: cfg.Pool, Counter: &rt.Counter{}})
		if err == nil {
			r.inst = inst
			for g := 0; g < cfg.Goroutines && err == nil; g++ {
				var op Op
				op, err = inst.Worker(g)
				r.workers = append(r.workers, op)
			}
		}
		if err != nil {
			res.Unavailable = "set-up failed: " + err.Error()
			if r.inst != nil {
				r.inst.Close()
			}
			continue
		}
		// Keys differ per contender: a slow poller's leftovers never meet
		// the next contender.
		_ = i
		runs = append(runs, r)
	}
	for round := 0; round < rounds; round++ {
		for i := range runs {
			r := runs[i]
			if round%2 == 1 {
				r = runs[len(runs)-1-i]
			}
			kb := base + int64(indexOf(runs, r))*20
			st := s.slice(ctx, r.workers, cfg, kb, slice)
			r.absorb(st)
		}
	}
	var raw *ContentionResult
	var rawRounds []float64
	for _, r := range runs {
		res := r.res
		res.Seconds = r.secs
		for _, c := range r.counts {
			res.Acquisitions += c
		}
		if r.secs > 0 {
			res.PerSec = float64(res.Acquisitions) / r.secs
		}
		res.Wait = summarize(r.waits)
		res.Handoff = summarize(r.hand)
		res.PerGoroutine = spread(r.counts)
		if keepCounts {
			res.Counts = r.counts
		}
		if r.c.Name == rawLockUnlock.Name {
			raw, rawRounds = res, r.rounds
		}
		r.inst.Close()
	}
	if raw != nil {
		for _, r := range runs {
			r.res.Ratio = ratio(r.res.PerSec, raw.PerSec)
			r.res.PairedRatio = pairedRatio(r.rounds, rawRounds)
		}
	}
	return s.save()
}

func indexOf(runs []*ctRun, r *ctRun) int {
	for i, x := range runs {
		if x == r {
			return i
		}
	}
	return -1
}

type sliceStats struct {
	counts     []int
	waits      []time.Duration
	hand       []time.Duration
	secs       float64
	errors     int
	firstErr   string
	violations int64
	hardStop   bool
}

func (r *ctRun) absorb(st sliceStats) {
	for i, c := range st.counts {
		r.counts[i] += c
	}
	r.waits = append(r.waits, st.waits...)
	r.hand = append(r.hand, st.hand...)
	r.secs += st.secs
	n := 0
	for _, c := range st.counts {
		n += c
	}
	r.rounds = append(r.rounds, ratio(float64(n), st.secs))
	r.res.Errors += st.errors
	if r.res.FirstError == "" {
		r.res.FirstError = st.firstErr
	}
	r.res.Violations += st.violations
	if st.hardStop {
		r.res.HardStops++
	}
}

type keyState struct {
	holders atomic.Int32
	relAt   atomic.Int64 // monotonic ns of the last release start, +1 (0: none yet)
}

// slice runs the workers for d and returns what they measured. After d the
// workers finish the call they are in; those still waiting after the grace
// period are cancelled (a hard stop, reported).
func (s *Suite) slice(ctx context.Context, workers []Op, cfg ContentionConfig, keyBase int64, d time.Duration) sliceStats {
	t0 := time.Now()
	mono := func() int64 { return int64(time.Since(t0)) }
	ks := make([]keyState, cfg.Keys)
	var (
		stop       atomic.Bool
		violations atomic.Int64
		wg         sync.WaitGroup
		mu         sync.Mutex
		st         = sliceStats{counts: make([]int, len(workers))}
	)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := make(chan struct{})
	var winStart, winEnd int64
	for g, op := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(keyBase), uint64(g)))
			var (
				count         int
				waits, hand   []time.Duration
				errs          int
				firstErr      string
				key           = make([]int64, 1)
				ki            int
				waitAt, acqAt int64
				prevRel       int64
			)
			fn := func() {
				acqAt = mono()
				k := &ks[ki]
				if k.holders.Add(1) != 1 {
					violations.Add(1)
				}
				prevRel = k.relAt.Load()
				if cfg.Work > 0 {
					time.Sleep(cfg.Work)
				}
				k.holders.Add(-1)
				k.relAt.Store(mono() + 1)
			}
			<-start
			for !stop.Load() {
				ki = 0
				if cfg.Keys > 1 {
					ki = rng.IntN(cfg.Keys)
				}
				key[0] = keyBase + int64(ki)
				acqAt, prevRel = -1, 0
				waitAt = mono()
				err := op(cctx, key, fn)
				if err != nil {
					if cctx.Err() != nil {
						break
					}
					errs++
					if firstErr == "" {
						firstErr = err.Error()
					}
					time.Sleep(time.Millisecond) // no hot loop on a persistent failure
					continue
				}
				if acqAt < winStart || acqAt >= winEnd {
					continue
				}
				count++
				waits = append(waits, time.Duration(acqAt-waitAt))
				if prevRel > 0 && waitAt < prevRel-1 {
					hand = append(hand, time.Duration(acqAt-(prevRel-1)))
				}
			}
			mu.Lock()
			st.counts[g] = count
			st.waits = append(st.waits, waits...)
			st.hand = append(st.hand, hand...)
			st.errors += errs
			if st.firstErr == "" {
				st.firstErr = firstErr
			}
			mu.Unlock()
		}()
	}
	winStart = mono()
	winEnd = winStart + int64(d)
	close(start)
	time.Sleep(d)
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.params.grace):
		st.hardStop = true
		cancel()
		<-done
	}
	st.secs = float64(d) / 1e9
	st.violations = violations.Load()
	return st
}
