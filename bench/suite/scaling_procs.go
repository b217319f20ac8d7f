package suite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Processes: P OS processes (replicas), each with its own pool of
// procPool connections and procGoroutines goroutines, loop lock, no work,
// unlock on one key or on a key drawn at random from 16. The suite re-execs
// its own binary as the children (ChildMain); they share, through a
// memory-mapped file, one record per key: the number of holders (a
// mutual-exclusion check across processes) and the wall-clock time of the
// last release start (hand-offs between processes; all children run on
// this machine, so they read one clock).

const (
	procGoroutines = 4
	procPool       = 4
	// childEnvVar carries a child's JSON spec; its presence makes a process
	// a child.
	childEnvVar = "PGXLOCKBENCH_SCALING_CHILD"
)

// ProcConfig is one point of the processes matrix.
type ProcConfig struct {
	Procs      int `json:"procs"`
	Keys       int `json:"keys"`
	Goroutines int `json:"goroutines_per_proc"`
	Pool       int `json:"pool_per_proc"`
}

func (c ProcConfig) String() string {
	return fmt.Sprintf("%d process(es) x %d goroutines (pool %d each), %d key(s)", c.Procs, c.Goroutines, c.Pool, c.Keys)
}

// ProcResult is one contender at one point of the processes matrix.
type ProcResult struct {
	Config       ProcConfig `json:"config"`
	Row          string     `json:"row"`
	Impl         string     `json:"impl"`
	Peer         bool       `json:"peer"`
	Unavailable  string     `json:"unavailable,omitempty"`
	Acquisitions int        `json:"acquisitions"`
	Seconds      float64    `json:"seconds"`
	PerSec       float64    `json:"acq_per_sec"`
	Ratio        float64    `json:"throughput_ratio_vs_raw"`
	PairedRatio  float64    `json:"paired_throughput_ratio_vs_raw"`
	Wait         Dist       `json:"wait"`
	Handoff      Dist       `json:"handoff"`
	CrossHandoff float64    `json:"cross_process_handoff_share"` // hand-offs whose previous holder was another process
	PerProcess   Spread     `json:"per_process"`
	Counts       []int      `json:"counts_per_process"`
	Errors       int        `json:"errors"`
	FirstError   string     `json:"first_error,omitempty"`
	Violations   int64      `json:"violations"`
	HardStops    int        `json:"hard_stops"`
}

func procContenders() []Contender {
	return []Contender{pgxlockWithLock, rawLockUnlock, redislockObtain, etcdLock}
}

func (s *Suite) procMatrix() []ProcConfig {
	procs, ks := []int{1, 2, 4, 8}, []int{1, 16}
	if s.cfg.Quick {
		procs, ks = []int{1, 2}, []int{1}
	}
	var out []ProcConfig
	for _, k := range ks {
		for _, p := range procs {
			out = append(out, ProcConfig{Procs: p, Keys: k, Goroutines: procGoroutines, Pool: procPool})
		}
	}
	return out
}

// childSpec is what the parent tells a child.
type childSpec struct {
	Env       Env           `json:"env"`
	Contender string        `json:"contender"`
	Index     int           `json:"index"`
	Keys      int           `json:"keys"`
	Gor       int           `json:"goroutines"`
	Pool      int           `json:"pool"`
	KeyBase   int64         `json:"key_base"`
	Shm       string        `json:"shm"`
	Slice     time.Duration `json:"slice"`
	Grace     time.Duration `json:"grace"`
}

// childResult is what a child reports, one JSON line on stdout.
type childResult struct {
	Err        string  `json:"err,omitempty"`
	Count      int     `json:"count"`
	Waits      []int64 `json:"waits_ns"`
	Hand       []int64 `json:"handoffs_ns"`
	Cross      int     `json:"cross"`
	Errors     int     `json:"errors"`
	FirstErr   string  `json:"first_error,omitempty"`
	Violations int64   `json:"violations"`
	HardStop   bool    `json:"hard_stop"`
}

// sharedKey is one key's record in the memory-mapped file (16 bytes).
type sharedKey struct {
	holders atomic.Int32
	owner   atomic.Int32 // index+1 of the process that released last
	relAt   atomic.Int64 // wall-clock ns of the last release start (0: none yet)
}

func mapShared(path string, n int) ([]sharedKey, func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	size := n * int(unsafe.Sizeof(sharedKey{}))
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*sharedKey)(unsafe.Pointer(&b[0])), n), func() { _ = syscall.Munmap(b) }, nil
}

// ChildMain runs a scaling child and exits when this process was started as
// one by the processes workload of the scaling or of the held section (an environment variable carries its
// spec); otherwise it returns at once. Call it first in main (and in
// TestMain of a test binary that runs the suite).
func ChildMain() {
	heldChildMain() // the held section's children (held_procs.go)
	spec := os.Getenv(childEnvVar)
	if spec == "" {
		return
	}
	res := runChild(spec)
	b, _ := json.Marshal(res)
	os.Stdout.Write(append(b, '\n'))
	os.Exit(0)
}

func runChild(specJSON string) (res childResult) {
	var sp childSpec
	if err := json.Unmarshal([]byte(specJSON), &sp); err != nil {
		return childResult{Err: "bad spec: " + err.Error()}
	}
	var c *Contender
	for _, x := range procContenders() {
		if x.Name == sp.Contender {
			c = &x
		}
	}
	if c == nil {
		return childResult{Err: "unknown contender " + sp.Contender}
	}
	ks, unmap, err := mapShared(sp.Shm, sp.Keys)
	if err != nil {
		return childResult{Err: err.Error()}
	}
	defer unmap()
	ctx := context.Background()
	inst, err := c.New(ctx, &sp.Env, Spec{PoolSize: sp.Pool})
	if err != nil {
		return childResult{Err: "set-up: " + err.Error()}
	}
	defer inst.Close()
	var workers []Op
	for g := 0; g < sp.Gor; g++ {
		op, err := inst.Worker(g)
		if err != nil {
			return childResult{Err: "set-up: " + err.Error()}
		}
		workers = append(workers, op)
	}
	// Warm up outside the measured window (see warmUp).
	if err := warmUp(ctx, workers, func(g int) int64 { return sp.KeyBase + int64(sp.Keys+1+sp.Index*sp.Gor+g) }); err != nil {
		return childResult{Err: "warm-up: " + err.Error()}
	}
	// Ready; wait for the parent's go (a line on stdin).
	fmt.Fprintln(os.Stdout, "ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return childResult{Err: "no go from the parent: " + err.Error()}
	}
	return childLoop(ctx, &sp, ks, workers)
}

// warmUp has every worker take its private key (key(g)) and hold it until
// all of them hold theirs, so that the pool dials as many connections as
// there are workers and the library sets itself up, before the measured
// window. (Taken one after another, the keys had needed one connection: the
// others were dialled inside the window, by whichever process first needed
// a second connection, which lost turns meanwhile.) It returns the first
// error of an op.
func warmUp(ctx context.Context, workers []Op, key func(g int) int64) error {
	var (
		held, done sync.WaitGroup
		mu         sync.Mutex
		first      error
	)
	held.Add(len(workers))
	for g, op := range workers {
		done.Add(1)
		go func() {
			defer done.Done()
			called := false // fn runs only once the key is held; a failed op never calls it
			err := op(ctx, []int64{key(g)}, func() {
				called = true
				held.Done()
				held.Wait()
			})
			if !called {
				held.Done()
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	done.Wait()
	return first
}

func childLoop(ctx context.Context, sp *childSpec, ks []sharedKey, workers []Op) childResult {
	var (
		stop       atomic.Bool
		violations atomic.Int64
		wg         sync.WaitGroup
		mu         sync.Mutex
		res        childResult
	)
	me := int32(sp.Index + 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	winStart := time.Now().UnixNano()
	winEnd := winStart + int64(sp.Slice)
	for g, op := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(sp.KeyBase)+uint64(sp.Index), uint64(g)))
			var (
				count, errs, cross int
				waits, hand        []int64
				firstErr           string
				key                = make([]int64, 1)
				ki                 int
				waitAt, acqAt      int64
				prevRel            int64
				prevOwner          int32
			)
			fn := func() {
				acqAt = time.Now().UnixNano()
				k := &ks[ki]
				if k.holders.Add(1) != 1 {
					violations.Add(1)
				}
				prevRel, prevOwner = k.relAt.Load(), k.owner.Load()
				k.holders.Add(-1)
				k.owner.Store(me)
				k.relAt.Store(time.Now().UnixNano())
			}
			for !stop.Load() {
				ki = 0
				if sp.Keys > 1 {
					ki = rng.IntN(sp.Keys)
				}
				key[0] = sp.KeyBase + int64(ki)
				acqAt, prevRel = -1, 0
				waitAt = time.Now().UnixNano()
				if err := op(cctx, key, fn); err != nil {
					if cctx.Err() != nil {
						break
					}
					errs++
					if firstErr == "" {
						firstErr = err.Error()
					}
					time.Sleep(time.Millisecond)
					continue
				}
				if acqAt < winStart || acqAt >= winEnd {
					continue
				}
				count++
				waits = append(waits, acqAt-waitAt)
				if prevRel > 0 && waitAt < prevRel {
					hand = append(hand, acqAt-prevRel)
					if prevOwner != me {
						cross++
					}
				}
			}
			mu.Lock()
			res.Count += count
			res.Waits = append(res.Waits, waits...)
			res.Hand = append(res.Hand, hand...)
			res.Cross += cross
			res.Errors += errs
			if res.FirstErr == "" {
				res.FirstErr = firstErr
			}
			mu.Unlock()
		}()
	}
	time.Sleep(sp.Slice)
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(sp.Grace):
		res.HardStop = true
		cancel()
		<-done
	}
	res.Violations = violations.Load()
	return res
}

type procRun struct {
	c      Contender
	res    *ProcResult
	counts []int
	waits  []time.Duration
	hand   []time.Duration
	cross  int
	secs   float64
	rounds []float64
}

func (s *Suite) runProcesses(ctx context.Context) error {
	if !s.want("scaling", "processes") {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "pgxlockbench-shm-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p := s.params
	for ci, cfg := range s.procMatrix() {
		t0 := time.Now()
		var runs []*procRun
		for _, c := range procContenders() {
			res := &ProcResult{Config: cfg, Row: c.Name, Impl: c.Impl, Peer: c.Peer}
			s.res.Scaling.Processes = append(s.res.Scaling.Processes, res)
			if ok, why := s.env.available(&c); !ok {
				res.Unavailable = why
				continue
			}
			runs = append(runs, &procRun{c: c, res: res, counts: make([]int, cfg.Procs)})
		}
		for round := 0; round < p.spRounds; round++ {
			for i := range runs {
				r := runs[i]
				if round%2 == 1 {
					r = runs[len(runs)-1-i]
				}
				if r.res.Unavailable != "" {
					continue
				}
				kb := s.env.KeyBase + 400000 + int64(ci*1000+indexOfProc(runs, r)*100)
				shm := filepath.Join(dir, fmt.Sprintf("keys-%d-%d", ci, round))
				out, err := s.procSlice(ctx, exe, shm, r.c, cfg, kb, p.spSlice)
				if err != nil {
					r.res.Unavailable = err.Error()
					s.logf("scaling processes: %s, %s: %v", cfg, r.c.Name, err)
					continue
				}
				r.absorb(out, p.spSlice)
			}
		}
		var raw *procRun
		for _, r := range runs {
			if r.c.Name == rawLockUnlock.Name && r.res.Unavailable == "" {
				raw = r
			}
		}
		for _, r := range runs {
			res := r.res
			if res.Unavailable != "" {
				continue
			}
			res.Seconds = r.secs
			for _, c := range r.counts {
				res.Acquisitions += c
			}
			res.PerSec = ratio(float64(res.Acquisitions), r.secs)
			res.Wait = summarize(r.waits)
			res.Handoff = summarize(r.hand)
			res.CrossHandoff = ratio(float64(r.cross), float64(len(r.hand)))
			res.PerProcess = spread(r.counts)
			res.Counts = r.counts
			if raw != nil {
				res.Ratio = ratio(res.PerSec, raw.res.PerSec)
				res.PairedRatio = pairedRatio(r.rounds, raw.rounds)
			}
		}
		s.logf("scaling processes: %s (%v)", cfg, time.Since(t0).Round(time.Millisecond))
		if err := s.save(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func indexOfProc(runs []*procRun, r *procRun) int {
	for i, x := range runs {
		if x == r {
			return i
		}
	}
	return -1
}

func (r *procRun) absorb(out []childResult, d time.Duration) {
	n := 0
	for i, c := range out {
		r.counts[i] += c.Count
		n += c.Count
		for _, w := range c.Waits {
			r.waits = append(r.waits, time.Duration(w))
		}
		for _, h := range c.Hand {
			r.hand = append(r.hand, time.Duration(h))
		}
		r.cross += c.Cross
		r.res.Errors += c.Errors
		if r.res.FirstError == "" {
			r.res.FirstError = c.FirstErr
		}
		r.res.Violations += c.Violations
		if c.HardStop {
			r.res.HardStops++
		}
	}
	r.secs += d.Seconds()
	r.rounds = append(r.rounds, ratio(float64(n), d.Seconds()))
}

// procSlice starts cfg.Procs children running c, lets them all set up,
// starts them together for d and collects what they measured.
func (s *Suite) procSlice(ctx context.Context, exe, shm string, c Contender, cfg ProcConfig, kb int64, d time.Duration) ([]childResult, error) {
	if err := os.WriteFile(shm, make([]byte, cfg.Keys*int(unsafe.Sizeof(sharedKey{}))), 0o600); err != nil {
		return nil, err
	}
	defer os.Remove(shm)
	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		stderr bytes.Buffer
	}
	// Every child is bounded: set-up, the slice, the grace and a margin.
	cctx, cancel := context.WithTimeout(ctx, d+s.params.grace+60*time.Second)
	defer cancel()
	children := make([]*child, cfg.Procs)
	defer func() {
		for _, ch := range children {
			if ch != nil {
				ch.stdin.Close()
				_ = ch.cmd.Wait()
			}
		}
	}()
	for i := range children {
		spec, err := json.Marshal(childSpec{Env: s.env, Contender: c.Name, Index: i, Keys: cfg.Keys, Gor: cfg.Goroutines,
			Pool: cfg.Pool, KeyBase: kb, Shm: shm, Slice: d, Grace: s.params.grace})
		if err != nil {
			return nil, err
		}
		ch := &child{cmd: exec.CommandContext(cctx, exe)}
		ch.cmd.Env = append(os.Environ(), childEnvVar+"="+string(spec))
		ch.cmd.Stderr = &ch.stderr
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			return nil, err
		}
		out, err := ch.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		ch.stdout = bufio.NewReaderSize(out, 1<<20)
		if err := ch.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start child: %w", err)
		}
		children[i] = ch
	}
	// A child that fails its set-up reports the error instead of "ready".
	for _, ch := range children {
		line, err := ch.stdout.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("child: %w (%s)", err, oneLine(ch.stderr.String()))
		}
		if line != "ready\n" {
			var r childResult
			if json.Unmarshal([]byte(line), &r) == nil && r.Err != "" {
				return nil, errors.New(r.Err)
			}
			return nil, fmt.Errorf("child said %q", oneLine(line))
		}
	}
	for _, ch := range children {
		if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
			return nil, err
		}
	}
	out := make([]childResult, len(children))
	for i, ch := range children {
		line, err := ch.stdout.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("child result: %w (%s)", err, oneLine(ch.stderr.String()))
		}
		if err := json.Unmarshal(line, &out[i]); err != nil {
			return nil, fmt.Errorf("child result: %w", err)
		}
		if out[i].Err != "" {
			return nil, errors.New(out[i].Err)
		}
	}
	return out, nil
}
