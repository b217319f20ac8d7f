package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/keys"
)

// workerEnv carries a workerSpec (JSON) to a worker process: the soak binary (or its
// test binary) re-executed with it set runs [worker] instead of the parent.
const workerEnv = "PGXLOCK_SOAK_WORKER"

// workerSpec tells a worker process what to do.
type workerSpec struct {
	Index      int      // the worker's number; its clients are Index*Goroutines + g
	DSN        string   // the database; its host and port are replaced by these:
	LockHosts  []string // the lock pool's hosts (proxies that the netcut fault cuts)
	ObsHosts   []string // the observer's (proxies never cut)
	ReadWrite  bool     // several hosts: connect only to the one that takes writes
	App        string   // application_name of the lock pool; the observer's adds "-obs"
	Keys       []int64  // the contended keys
	Goroutines int
	Journal    string        // where the events go (JSON lines)
	Seed       uint64        // random choices
	OpTimeout  time.Duration // bounds one operation (acquire, section, release)
	Heartbeat  time.Duration // advisory Config.HeartbeatInterval and HeartbeatTimeout
	// Multiplexed leaves advisory Config.DisableMultiplexing at its default (held locks
	// share holder connections); false sets it (a connection per held lock).
	Multiplexed bool
}

// workerStats are a worker's cumulative counters, printed as one JSON line on stdout
// every second and at exit.
type workerStats struct {
	Index     int            `json:"worker"`
	Acquired  int64          `json:"acquired"`
	Busy      int64          `json:"busy"`
	Timeouts  int64          `json:"timeouts"`
	Lost      int64          `json:"lost"`      // sections whose lock call reported ErrLockLost
	Cancelled int64          `json:"cancelled"` // operations cancelled on the parent's SIGUSR1
	Unknown   int64          `json:"unknown"`   // lost or failed ops whose release was never confirmed
	Errors    map[string]int `json:"errors"`    // by class
	Final     bool           `json:"final,omitempty"`
}

// worker runs one worker process until its stdin closes (the parent's stop signal, or the
// parent's death), then lets every goroutine finish its operation and exits. After stdin
// closes it runs at most OpTimeout (the operation) plus 30 s (the pg_locks confirmation
// of a failed one, see confirmGone) plus the pools' close; the parent's watchdog kills it
// after that. Its history goes to spec.Journal as it is recorded.
func worker(raw string) int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "soak worker: bad spec: %v\n", err)
		return 2
	}
	if err := runWorker(spec); err != nil {
		fmt.Fprintf(os.Stderr, "soak worker %d: %v\n", spec.Index, err)
		return 1
	}
	return 0
}

func runWorker(spec workerSpec) error {
	// SIGUSR1 would end the process until it is caught; the parent sends it only after
	// the first stats line (printed below, once this is set up).
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGUSR1)
	defer signal.Stop(sig)
	stop := make(chan struct{})
	go func() { // ends with the process
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	ctx := context.Background()

	pool, err := newWorkerPool(ctx, spec, spec.LockHosts, spec.App, int32(spec.Goroutines)+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	obs, err := newWorkerPool(ctx, spec, spec.ObsHosts, spec.App+"-obs", 4)
	if err != nil {
		return err
	}
	defer obs.Close()
	l, err := advisory.New(pool, advisory.Config{HeartbeatInterval: spec.Heartbeat, HeartbeatTimeout: spec.Heartbeat,
		DisableMultiplexing: !spec.Multiplexed})
	if err != nil {
		return err
	}
	f, err := os.Create(spec.Journal)
	if err != nil {
		return err
	}
	defer f.Close()
	rec := history.NewRecorder(spec.App, f)

	w := &workerRun{spec: spec, l: l, obs: obs, rec: rec, cancels: make([]atomic.Pointer[context.CancelCauseFunc], spec.Goroutines)}
	w.stats.Index = spec.Index
	w.stats.Errors = map[string]int{}

	// SIGUSR1 from the parent (sig, set up first thing): cancel the operation of one
	// random goroutine.
	rng := rand.New(rand.NewPCG(spec.Seed, 1))
	sigDone := make(chan struct{})
	go func() { // owned: ends when sig is closed below
		defer close(sigDone)
		for range sig {
			for range len(w.cancels) { // a few tries to find a busy goroutine
				if c := w.cancels[rng.IntN(len(w.cancels))].Load(); c != nil {
					(*c)(errInjectedCancel)
					w.count(func(s *workerStats) { s.Cancelled++ })
					break
				}
			}
		}
	}()

	w.printStats(false) // ready: the parent may signal from now on
	var tick sync.WaitGroup
	tickStop := make(chan struct{})
	tick.Add(1)
	go func() {
		defer tick.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-tickStop:
				return
			case <-t.C:
				w.printStats(false)
			}
		}
	}()

	var wg sync.WaitGroup
	for g := range spec.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(spec.Seed, uint64(g)+2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				w.op(rng, g)
			}
		}()
	}
	wg.Wait()
	signal.Stop(sig)
	close(sig)
	<-sigDone
	close(tickStop)
	tick.Wait()
	w.printStats(true)
	return errors.Join(rec.Err(), f.Close())
}

var errInjectedCancel = errors.New("soak: cancelled by the parent (injected fault)")

func newWorkerPool(ctx context.Context, spec workerSpec, hosts []string, app string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(spec.DSN, hosts, spec.ReadWrite, app, maxConns)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// errorClass names the kind of an operation's error for the counts.
func errorClass(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, advisory.ErrLockLost):
		return "lock lost"
	case errors.Is(err, advisory.ErrNotAcquired):
		return "busy"
	case errors.Is(err, advisory.ErrLockTimeout):
		return "lock timeout"
	case errors.Is(err, errInjectedCancel):
		return "cancelled (injected)"
	case errors.Is(err, context.DeadlineExceeded):
		return "op timeout"
	case errors.Is(err, advisory.ErrNoConnection):
		return "no connection"
	case errors.As(err, &pgErr):
		return "sqlstate " + pgErr.Code
	case pgconn.Timeout(err):
		return "network timeout"
	}
	return classOther
}

const classOther = "connection/other"

// workerRun is the state of one worker process.
type workerRun struct {
	spec    workerSpec
	l       *advisory.Locker
	obs     *pgxpool.Pool
	rec     *history.Recorder
	cancels []atomic.Pointer[context.CancelCauseFunc] // per goroutine: its operation's cancel

	mu    sync.Mutex
	stats workerStats
}

func (w *workerRun) count(f func(*workerStats)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.stats)
}

func (w *workerRun) printStats(final bool) {
	w.mu.Lock()
	w.stats.Final = final
	b, err := json.Marshal(w.stats)
	w.mu.Unlock()
	if err == nil {
		fmt.Fprintf(os.Stdout, "%s\n", b)
	}
}

// apis are the ways an operation takes a lock.
var apis = []string{"Lock", "TryLock", "Hold", "TryHold", "WithLock", "TryWithLock", "WithXactLock", "TryWithXactLock"}

// op runs one random operation of goroutine g and records it.
func (w *workerRun) op(rng *rand.Rand, g int) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx, cancelT := context.WithTimeout(ctx, w.spec.OpTimeout)
	defer cancelT()
	w.cancels[g].Store(&cancel)
	defer w.cancels[g].Store(nil)

	ki := rng.IntN(len(w.spec.Keys))
	key := keys.Int64(w.spec.Keys[ki])
	via := apis[rng.IntN(len(apis))]
	opts := &advisory.Options{Shared: rng.IntN(5) == 0}
	if rng.IntN(5) == 0 {
		opts.Timeout = time.Duration(10+rng.IntN(90)) * time.Millisecond
	}
	// Most sections are short; one in ten is long enough for a fault to land inside.
	hold := time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
	if rng.IntN(10) == 0 {
		hold = time.Duration(20+rng.IntN(180)) * time.Millisecond
	}
	// work is the critical section: a query on the lock's connection or transaction
	// when there is one, then a short hold that ends early if ctx does.
	work := func(ctx context.Context, q execer) error {
		if q != nil {
			if _, err := q.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
		}
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
			return nil
		}
	}

	rec := w.rec
	client := fmt.Sprintf("w%d.g%d", w.spec.Index, g)
	keyName := strconv.FormatInt(w.spec.Keys[ki], 10)
	// The section's events: the acquire (returns when the section starts), then a
	// release (called when the section ends) or, when the call fails after the section
	// began, a Lost from the acquire's call to when pg_locks showed the key gone from
	// this worker's sessions.
	called := history.Now() // no later than the acquire's call
	acq := rec.Begin(history.Op{Client: client, Key: keyName, Kind: history.Acquire, Shared: opts.Shared})
	var entered int64 // history.Now() just after the acquire's return; 0: not reached
	var rel *history.Pending
	enter := func() {
		acq.End(history.OK, 0)
		entered = history.Now()
	}
	leave := func() {
		rel = rec.Begin(history.Op{Client: client, Key: keyName, Kind: history.Release, Shared: opts.Shared})
	}
	var err error
	switch via {
	case "Lock", "TryLock":
		var h *advisory.Lock
		if via == "Lock" {
			h, err = w.l.Lock(ctx, key, opts)
		} else {
			h, err = w.l.TryLock(ctx, key, opts)
		}
		if err == nil {
			enter()
			werr := work(ctx, nil)
			select {
			case <-h.Done():
				werr = errors.Join(werr, h.Err())
			default:
			}
			leave()
			err = errors.Join(werr, h.Unlock(ctx))
		}
	case "Hold", "TryHold":
		fn := func(ctx context.Context) error {
			enter()
			defer leave()
			return work(ctx, nil)
		}
		if via == "Hold" {
			err = w.l.Hold(ctx, key, opts, fn)
		} else {
			err = w.l.TryHold(ctx, key, opts, fn)
		}
	case "WithLock", "TryWithLock":
		fn := func(ctx context.Context, conn *pgx.Conn) error {
			enter()
			defer leave()
			return work(ctx, conn)
		}
		if via == "WithLock" {
			err = w.l.WithLock(ctx, key, opts, fn)
		} else {
			err = w.l.TryWithLock(ctx, key, opts, fn)
		}
	case "WithXactLock", "TryWithXactLock":
		fn := func(ctx context.Context, tx pgx.Tx) error {
			enter()
			defer leave()
			return work(ctx, tx)
		}
		if via == "WithXactLock" {
			err = w.l.WithXactLock(ctx, key, opts, fn)
		} else {
			err = w.l.TryWithXactLock(ctx, key, opts, fn)
		}
	}

	if errors.Is(err, advisory.ErrLockLost) {
		w.count(func(s *workerStats) { s.Lost++ })
	}
	if err != nil {
		class := errorClass(err)
		w.count(func(s *workerStats) {
			s.Errors[class]++
			if class == classOther && s.Errors[class] <= 3 {
				fmt.Fprintf(os.Stderr, "worker %d: %s: %v\n", w.spec.Index, via, err) // shown with -v
			}
		})
	}
	switch {
	case entered == 0 && err == nil:
		// Unreachable: every form runs its section when it returns nil.
		acq.End(history.Unknown, 0)
	case entered == 0 && errors.Is(err, advisory.ErrNotAcquired):
		acq.End(history.Busy, 0)
		w.count(func(s *workerStats) { s.Busy++ })
	case entered == 0 && errors.Is(err, advisory.ErrLockTimeout):
		// Not recorded as a Timeout, which the lock model allows only while another
		// client holds the key: a blocking call that queues in process behind an
		// earlier call of its Locker (advisory/gate.go) times out while the key is free
		// on the server when that earlier call is stuck, e.g. on a connection a
		// network cut silenced. The soak found this; the gate's doc allows it. So a
		// timeout is checked like any failed acquire: it held the key at no moment
		// after pg_locks shows it free of this worker's sessions.
		w.count(func(s *workerStats) { s.Timeouts++ })
		w.settle(acq, key)
	case entered == 0:
		// The call may have held the key for a moment on a connection it then
		// destroyed: settled once pg_locks shows that is over.
		w.settle(acq, key)
	case err == nil:
		w.count(func(s *workerStats) { s.Acquired++ })
		rel.End(history.OK, 0)
	default:
		w.count(func(s *workerStats) { s.Acquired++ })
		// The Lost starts at the acquire's call, not its return: the lock may go
		// between the grant and the section's start (the session terminated in
		// between; the first 10-minute soak showed it), and then another client
		// may take the key before this one's acquire returns.
		if w.confirmGone(key) {
			rec.Lost(client, keyName, called, history.Now())
			rel.EndUnknownBy()
		} else {
			// Never confirmed: open to the end of the history.
			rec.Lost(client, keyName, called, 0)
			rel.End(history.Unknown, 0)
			w.count(func(s *workerStats) { s.Unknown++ })
		}
	}
}

// settle ends a failed acquire: Unknown, settled when pg_locks shows the key free of this
// worker's sessions, else open to the end of the history.
func (w *workerRun) settle(acq *history.Pending, key keys.Key) {
	if w.confirmGone(key) {
		acq.EndUnknownBy()
		return
	}
	acq.End(history.Unknown, 0)
	w.count(func(s *workerStats) { s.Unknown++ })
}

// confirmGone returns once pg_locks (through the observer pool, which bypasses the
// proxies) shows none of the backends of this worker's lock pool that held key when it
// was called still holding it: from then on, a lock this worker's failed operation may
// have left on the server is gone. It returns false if it cannot tell within 30 s (the
// server unreachable all that time).
func (w *workerRun) confirmGone(key keys.Key) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pids []int32 // holders when called; nil until read
	for {
		ls, err := advisory.ListLocks(ctx, w.obs, key)
		if err == nil {
			var now []int32
			for _, li := range ls {
				if li.Granted && li.ApplicationName == w.spec.App {
					now = append(now, li.PID)
				}
			}
			if pids == nil {
				pids = now
				if len(pids) == 0 {
					return true
				}
			} else if !overlap(pids, now) {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// execer is what a critical section queries: the lock's *pgx.Conn or pgx.Tx.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func overlap(a, b []int32) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}
