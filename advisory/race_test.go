package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The cancel/grant race. Another session holds a key; a Locker call waits
// for it; the waiter's context is cancelled at an offset around the moment
// the holder releases the key, so that the grant and the cancellation meet.
// Whichever wins, the call must either run the callback and release, or
// return ctx's error, and afterwards no connection of the Locker's pool may
// hold an advisory lock. It runs under pgx's default context handler (which
// closes the connection when a context ends mid-statement) and under
// CancelRequestContextWatcherHandler (which keeps it); either way the server
// may answer 57014 to a cancel request that landed just after it granted
// the lock (measured with raw pgx: 32 of 600 trials leaked the lock into
// the pool), and the library must clean that up.
//
// What the run shows is logged: acquisitions and cancellations per call
// variant, the 57014 answers, and how often the server really held a lock
// when the client saw the error (errorProbe). For the transaction variants
// that count is 0 by PostgreSQL's design: an error inside a transaction
// block aborts it at once, releasing its locks before ROLLBACK.
//
// The offset is steered by staircases per call variant, shared by the
// workers of a handler: when the cancel wins, the next cancel comes later,
// otherwise earlier, so the offsets converge on the point where both
// outcomes are equally likely, which is the race window itself, wherever
// the machine and the handler put it. The client-side staircase decides on
// "the callback ran"; the server-side one, used for half the trials under
// the cancel-request handler, on "the server answered 57014". A uniform
// jitter spreads the trials across the window.

const (
	raceStaircaseStep = 80 * time.Microsecond
	raceJitter        = 400 * time.Microsecond
	raceMaxOffset     = 10 * time.Millisecond
	// Where the staircases start: the client-side boundary lies after the
	// release (the grant must travel back), the server-side one before it
	// (the cancel request must travel there).
	raceClientStart = time.Millisecond
	raceServerStart = -time.Millisecond
)

type raceVariant int

const (
	raceWithLock raceVariant = iota
	raceWithXactLock
	raceWithLockAll
	raceWithXactLockAll
	numRaceVariants
)

var raceVariantNames = [numRaceVariants]string{"WithLock", "WithXactLock", "WithLockAll", "WithXactLockAll"}

// raceTarget is the boundary a trial's offset is steered to.
type raceTarget int

const (
	// targetClient: the callback runs (acquired) or not (cancelled).
	targetClient raceTarget = iota
	// targetServer: the server answers 57014, or not. With the cancel
	// request handler this is where the cancel lands at the grant, the
	// window in which the server can keep the lock while the client gets
	// 57014.
	targetServer
	numRaceTargets
)

// raceVariantOf spreads the trials: every other one is WithLock, the rest
// cycle through the others.
func raceVariantOf(i int) raceVariant {
	if i%2 == 0 {
		return raceWithLock
	}
	return raceVariant(1 + (i/2)%3)
}

// raceHandler is one pgx context handler and how the trials are spread
// over parallel workers: a cancelled wait under the cancel-request handler
// costs pgx's 100 ms pause after each cancel request (twice when COMMIT
// then runs on the cancelled context), time spent idle, so that handler
// gets more workers; the default handler's trials are CPU-bound and short.
type raceHandler struct {
	name    string
	build   func(*pgconn.PgConn) ctxwatch.Handler // nil: pgx's default
	workers int
	iters   int  // per worker
	server  bool // steer half the trials to the server-side boundary
}

// targetOf: with h.server, trials alternate in pairs between the two
// boundaries, so that every variant meets both.
func (h raceHandler) targetOf(i int) raceTarget {
	if h.server && i%4 >= 2 {
		return targetServer
	}
	return targetClient
}

var raceHandlers = []raceHandler{
	{name: "default-handler", workers: 6, iters: 96},
	{name: "cancel-request-handler", workers: 12, iters: 48, server: true, build: func(c *pgconn.PgConn) ctxwatch.Handler {
		// The cancel request goes out at once; the deadline is only the
		// fallback for a server that does not answer it.
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, CancelRequestDelay: 0, DeadlineDelay: 2 * time.Second}
	}},
}

// raceTally aggregates the outcomes of one handler's workers.
type raceTally struct {
	centers [numRaceTargets][numRaceVariants]atomic.Int64 // staircases: cancel offset in ns relative to the release

	mu           sync.Mutex
	acquired     [numRaceVariants]int
	cancelled    [numRaceVariants]int
	serverCancel [numRaceVariants]int   // cancelled calls whose chain holds the server's 57014
	commitFailed int                    // xact calls whose callback ran but COMMIT saw the cancelled ctx
	newConns     int64                  // connections the Locker pools opened (a destroyed one is replaced)
	heldAtError  [numRaceVariants]int64 // the server held a lock after the lock statement failed (see errorProbe)
	probed       int64                  // failed lock statements whose connection survived to be probed
	lateCancels  [numRaceVariants]int   // see raceOutcome.lateCancel
	early        [numRaceVariants]int   // see raceOutcome.early
	acqOffsets   []time.Duration
	canOffsets   []time.Duration
}

func newRaceTally() *raceTally {
	r := &raceTally{}
	for v := range numRaceVariants {
		r.centers[targetClient][v].Store(int64(raceClientStart))
		r.centers[targetServer][v].Store(int64(raceServerStart))
	}
	return r
}

func (r *raceTally) record(v raceVariant, o raceOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o.early {
		r.early[v]++ // hit before the race: neither outcome
	} else if o.acquired {
		r.acquired[v]++
		r.acqOffsets = append(r.acqOffsets, o.offset)
	} else {
		r.cancelled[v]++
		r.canOffsets = append(r.canOffsets, o.offset)
	}
	if o.serverCancel {
		r.serverCancel[v]++
	}
	if o.commitFailed {
		r.commitFailed++
	}
	if o.heldAtError {
		r.heldAtError[v]++
	}
	if o.probed {
		r.probed++
	}
	if o.lateCancel {
		r.lateCancels[v]++
	}
}

// offset picks the next cancel offset for v: the staircase point plus
// jitter, bounded.
func (r *raceTally) offset(g raceTarget, v raceVariant) time.Duration {
	c := time.Duration(r.centers[g][v].Load())
	d := c + time.Duration(rand.Int64N(int64(2*raceJitter))) - raceJitter
	return min(max(d, -raceMaxOffset), raceMaxOffset)
}

// step moves a staircase: cancel later next time if this trial's cancel
// won (the callback did not run; or, for the server boundary, the server
// answered 57014), earlier otherwise.
func (r *raceTally) step(g raceTarget, v raceVariant, o raceOutcome) {
	cancelWon := !o.acquired
	if g == targetServer {
		cancelWon = o.serverCancel
	}
	d := int64(raceStaircaseStep)
	if !cancelWon {
		d = -d
	}
	c := &r.centers[g][v]
	for {
		old := c.Load()
		nv := min(max(old+d, int64(-raceMaxOffset)), int64(raceMaxOffset))
		if c.CompareAndSwap(old, nv) {
			return
		}
	}
}

func (r *raceTally) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	totalA, totalC, totalS := 0, 0, 0
	for v := range numRaceVariants {
		totalA += r.acquired[v]
		totalC += r.cancelled[v]
		totalS += r.serverCancel[v]
		fmt.Fprintf(&b, "  %-16s acquired %4d  cancelled %4d (57014 %3d, with a lock held at the error %3d)  offset points: client %v, server %v\n",
			raceVariantNames[v], r.acquired[v], r.cancelled[v], r.serverCancel[v], r.heldAtError[v],
			time.Duration(r.centers[targetClient][v].Load()).Round(time.Microsecond),
			time.Duration(r.centers[targetServer][v].Load()).Round(time.Microsecond))
	}
	early := 0
	for _, n := range r.early {
		early += n
	}
	fmt.Fprintf(&b, "  total: %d trials, acquired %d, cancelled %d (of which the server answered 57014: %d); "+
		"callback ran but COMMIT saw the cancelled ctx: %d; connections opened by the Locker pools: %d\n",
		totalA+totalC+early, totalA, totalC, totalS, r.commitFailed, r.newConns)
	fmt.Fprintf(&b, "  failed lock statements whose connection survived (probed before the library's cleanup): %d\n", r.probed)
	fmt.Fprintf(&b, "  late cancel requests (pgx gave up on them, the server delivered them) that hit a later statement: %v per variant, %v of them the next call's lock wait\n",
		r.lateCancels, r.early)
	fmt.Fprintf(&b, "  cancel offset vs release (negative: cancel first): acquired %s; cancelled %s",
		spread(r.acqOffsets), spread(r.canOffsets))
	return b.String()
}

// spread renders min / median / max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	return fmt.Sprintf("min %v / median %v / max %v", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

func TestCancelGrantRaceLeaksNoLock(t *testing.T) {
	for _, h := range raceHandlers {
		t.Run(h.name, func(t *testing.T) {
			ctx := testCtx(t)
			tally := newRaceTally()
			// Holders and the monitor are shared by the workers: neither
			// ever keeps a lock across a trial.
			hcfg := pgtest.Config(t)
			hcfg.MaxConns = int32(h.workers)
			holders := pgtest.NewPool(t, hcfg)
			mcfg := pgtest.Config(t)
			mcfg.MaxConns = int32(h.workers)
			monitor := pgtest.NewPool(t, mcfg)

			// The workers are goroutines rather than parallel subtests,
			// which -parallel (GOMAXPROCS) would throttle; they report
			// failures as errors and stop at the first.
			workers := make([]*raceWorker, h.workers)
			for i := range workers {
				workers[i] = newRaceWorker(ctx, t, h, holders, monitor)
			}
			start := time.Now()
			var wg sync.WaitGroup
			for i, w := range workers {
				wg.Go(func() {
					if err := w.run(tally); err != nil {
						t.Errorf("worker %d: %v", i, err)
					}
				})
			}
			wg.Wait()
			for _, w := range workers {
				tally.newConns += w.pool.Stat().NewConnsCount()
				assert.EqualValues(t, 0, w.pool.Stat().AcquiredConns())
			}
			t.Logf("cancel/grant race, %s, %d workers x %d trials in %v:\n%s", h.name, h.workers, h.iters,
				time.Since(start).Round(time.Millisecond), tally.summary())

			tally.mu.Lock()
			defer tally.mu.Unlock()
			a, c, e := 0, 0, 0
			for v := range numRaceVariants {
				a += tally.acquired[v]
				c += tally.cancelled[v]
				e += tally.early[v]
			}
			if t.Failed() {
				return
			}
			assert.Equal(t, h.workers*h.iters, a+c+e)
			assert.Positive(t, tally.acquired[raceWithLock], "the race must produce acquisitions")
			assert.Positive(t, tally.cancelled[raceWithLock], "the race must produce cancellations")
			assert.Positive(t, a)
			assert.Positive(t, c)
		})
	}
}

// raceWorker is one worker's sessions: the Locker's pool (the one that must
// never keep a lock), a holder connection, and the shared monitor.
type raceWorker struct {
	h       raceHandler
	probe   *errorProbe
	ctx     context.Context
	pool    *pgxpool.Pool
	app     string
	l       *advisory.Locker
	holder  *pgxpool.Conn
	monitor *pgxpool.Pool
	lo, hi  keys.Key // lo < hi; the holder holds hi
	pair    keys.Key // sorts after both
	hiV     int64
}

// newRaceWorker sets a worker up from the test goroutine.
func newRaceWorker(ctx context.Context, t *testing.T, h raceHandler, holders, monitor *pgxpool.Pool) *raceWorker {
	t.Helper()
	cfg := pgtest.Config(t)
	cfg.MaxConns = 2
	if h.build != nil {
		cfg.ConnConfig.BuildContextWatcherHandler = h.build
	}
	w := &raceWorker{h: h, ctx: ctx, app: cfg.ConnConfig.RuntimeParams["application_name"], monitor: monitor}
	w.probe = &errorProbe{ctx: ctx, monitor: monitor}
	cfg.ConnConfig.Tracer = w.probe
	w.pool = pgtest.NewPool(t, cfg)
	w.l = newLocker(t, w.pool, advisory.Config{})
	hc, err := holders.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(hc.Release)
	w.holder = hc

	a, b := pgtest.UniqueInt64(t), pgtest.UniqueInt64(t)
	if a > b {
		a, b = b, a
	}
	require.NotEqual(t, a, b)
	w.lo, w.hi, w.hiV = keys.Int64(a), keys.Int64(b), b
	w.pair = keys.Pair(pgtest.UniqueInt32(t), 1)
	return w
}

func (w *raceWorker) run(tally *raceTally) error {
	for i := range w.h.iters {
		v, g := raceVariantOf(i), w.h.targetOf(i)
		planned := tally.offset(g, v)
		w.probe.arm()
		o, err := w.trial(v, planned)
		o.heldAtError, o.probed = w.probe.result()
		if err != nil {
			return fmt.Errorf("trial %d, %s, cancel offset %v: %w", i, raceVariantNames[v], o.offset, err)
		}
		if !o.early {
			tally.step(g, v, o)
		}
		tally.record(v, o)
	}
	return nil
}

// raceOutcome is what one trial did.
type raceOutcome struct {
	acquired     bool          // the callback ran
	offset       time.Duration // cancel time minus the time the holder's unlock was sent
	serverCancel bool          // the error chain holds the server's 57014
	commitFailed bool          // the callback ran, then COMMIT met the cancelled context
	lateCancel   bool          // a cancel request arrived after the statement it was sent for (see trial)
	early        bool          // ... and failed the call before the race
	probed       bool          // the lock statement failed and its connection survived
	heldAtError  bool          // ... and its backend held an advisory lock at that point
}

// trial runs one race and checks that nothing leaked. planned is when the
// waiter's context is to be cancelled relative to the holder's unlock being
// sent.
func (w *raceWorker) trial(v raceVariant, planned time.Duration) (o raceOutcome, err error) {
	ctx := w.ctx
	if _, err := w.holder.Exec(ctx, "SELECT pg_advisory_lock($1)", w.hiV); err != nil {
		return o, fmt.Errorf("holder lock: %w", err)
	}
	defer func() {
		if err != nil { // leave the holder's session clean whatever failed
			_, uerr := w.holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_all()")
			err = errors.Join(err, uerr)
		}
	}()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ran atomic.Bool
	done := make(chan error, 1)
	go func() { done <- w.call(wctx, v, &ran) }()
	if early, err := w.awaitWaiter(done); err != nil {
		return o, err
	} else if early != nil {
		// The call failed before it waited, with nothing cancelled yet:
		// only a late cancel request, sent for a statement of an earlier
		// trial on the same connection, does that (pgx's
		// CancelRequestContextWatcherHandler gives up on a cancel request
		// in flight when its statement ends, but the server may still
		// deliver it). The call must still leave nothing behind.
		if !isQueryCanceled(early) {
			return o, fmt.Errorf("the call returned before its context was cancelled, with %w", early)
		}
		o.lateCancel, o.early = true, true
		if _, err := w.holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", w.hiV); err != nil {
			return o, err
		}
		return o, w.checkNothingHeld()
	}

	// Place the cancel at the planned offset from the unlock. The waiting
	// is the workload (a point in time), not synchronisation: both
	// outcomes are legal and checked below. The actual times are recorded.
	base := time.Now().Add(100 * time.Microsecond)
	unlockAt, cancelAt := base, base.Add(planned)
	if planned < 0 {
		unlockAt, cancelAt = base.Add(-planned), base
	}
	cancelledAt := make(chan time.Time, 1)
	go func() {
		waitUntil(cancelAt)
		at := time.Now()
		cancel()
		cancelledAt <- at
	}()
	waitUntil(unlockAt)
	var unlocked bool
	unlockSent := time.Now()
	uerr := w.holder.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", w.hiV).Scan(&unlocked)
	o.offset = (<-cancelledAt).Sub(unlockSent)
	if uerr != nil || !unlocked {
		return o, fmt.Errorf("holder unlock: %v, %v", unlocked, uerr)
	}

	var callErr error
	select {
	case callErr = <-done:
	case <-time.After(15 * time.Second):
		return o, fmt.Errorf("%s did not return within 15s of its context's cancellation", raceVariantNames[v])
	}

	o.acquired = ran.Load()
	xact := v == raceWithXactLock || v == raceWithXactLockAll
	switch {
	case o.acquired && callErr == nil:
	case o.acquired && xact && errors.Is(callErr, context.Canceled):
		// The callback ran with the lock; COMMIT then met the cancelled
		// context. The transaction is gone either way (checked below).
		o.commitFailed = true
	case o.acquired && isQueryCanceled(callErr):
		// The cancel request arrived after the lock statement had ended
		// and cancelled the unlock or COMMIT: the library must destroy the
		// connection or roll back (checked below).
		o.lateCancel = true
	case o.acquired:
		return o, fmt.Errorf("the callback ran, the call failed: %w", callErr)
	case callErr == nil:
		return o, errors.New("the call succeeded without running its callback")
	default:
		var le *advisory.LockError
		if !errors.Is(callErr, context.Canceled) || !errors.As(callErr, &le) {
			return o, fmt.Errorf("a call that did not run its callback must return a *LockError with ctx's error, got %w", callErr)
		}
		var pgErr *pgconn.PgError
		o.serverCancel = errors.As(callErr, &pgErr) && pgErr.Code == "57014"
	}
	if err := w.checkNothingHeld(); err != nil {
		return o, fmt.Errorf("%w (call error: %v)", err, callErr)
	}
	return o, nil
}

func (w *raceWorker) call(ctx context.Context, v raceVariant, ran *atomic.Bool) error {
	sessionFn := func(context.Context, *pgx.Conn) error { ran.Store(true); return nil }
	xactFn := func(context.Context, pgx.Tx) error { ran.Store(true); return nil }
	all := []keys.Key{w.pair, w.hi, w.lo} // taken as lo, hi (waits), pair
	switch v {
	case raceWithLock:
		return w.l.WithLock(ctx, w.hi, nil, sessionFn)
	case raceWithXactLock:
		return w.l.WithXactLock(ctx, w.hi, nil, xactFn)
	case raceWithLockAll:
		return w.l.WithLockAll(ctx, all, nil, sessionFn)
	default:
		return w.l.WithXactLockAll(ctx, all, nil, xactFn)
	}
}

// awaitWaiter polls pg_locks until the Locker's call waits for hi. If the
// call returns instead, it returns the call's error as early.
func (w *raceWorker) awaitWaiter(done <-chan error) (early, err error) {
	classid, objid, objsubid := w.hi.PgLocks()
	err = poll(w.ctx, 10*time.Second, "the call to wait for the held key", func() (bool, error) {
		select {
		case cerr := <-done:
			if cerr == nil {
				return false, errors.New("the call succeeded although the key was held")
			}
			early = cerr
			return true, nil
		default:
		}
		var n int
		err := w.monitor.QueryRow(w.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&n)
		return n > 0, err
	})
	return early, err
}

func isQueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// checkNothingHeld: every connection is back in the pool or destroyed; no
// connection the pool kept holds or awaits an advisory lock, right now (a
// lock there would be handed to the next borrower); and the backends of
// destroyed connections, which may hold a lock for the few milliseconds
// until the server reads the closed socket, end.
func (w *raceWorker) checkNothingHeld() error {
	ctx := w.ctx
	if n := w.pool.Stat().AcquiredConns(); n != 0 {
		return fmt.Errorf("%d connections still acquired after the call returned", n)
	}
	// The pooled connections' backends, looked at from the monitor: a
	// statement on them could itself meet a late cancel request.
	var pids []int32
	for _, c := range w.pool.AcquireAllIdle(ctx) {
		pids = append(pids, int32(c.Conn().PgConn().PID()))
		c.Release()
	}
	var leaks []string
	rows, err := w.monitor.Query(ctx, `SELECT pid, classid, objid, objsubid, granted FROM pg_locks
		WHERE locktype = 'advisory' AND pid = ANY($1)`, pids)
	if err != nil {
		return err
	}
	for rows.Next() {
		var pid int32
		var classid, objid uint32
		var objsubid int16
		var granted bool
		if err := rows.Scan(&pid, &classid, &objid, &objsubid, &granted); err != nil {
			return err
		}
		k, _ := keys.FromPgLocks(classid, objid, objsubid)
		leaks = append(leaks, fmt.Sprintf("pooled connection (pid %d) holds %v (granted %v)", pid, k, granted))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(leaks) > 0 {
		return fmt.Errorf("LEAK into the pool: %s", strings.Join(leaks, "; "))
	}
	var left []pgtest.HeldLock
	err = poll(ctx, 5*time.Second, "the backends of destroyed connections to release their locks", func() (bool, error) {
		var err error
		left, err = pgtest.AdvisoryLocks(ctx, w.monitor, w.app)
		return len(left) == 0, err
	})
	if err != nil {
		return fmt.Errorf("%w: %v", err, left)
	}
	return nil
}

// errorProbe is a pgx tracer on the Locker's pool that measures the danger
// the library guards against: when a lock statement (a batch) fails and its
// connection survives, the next statement on that connection is the
// library's cleanup (unlock or rollback). Just before it is sent, the probe
// asks pg_locks, from the monitor, whether that backend still holds an
// advisory lock: the server granted a lock while the client got an error.
// The check after the trial then proves the cleanup released it.
type errorProbe struct {
	ctx     context.Context
	monitor *pgxpool.Pool

	mu     sync.Mutex
	failed *pgx.Conn // the connection whose last batch failed, if any
	probed bool
	held   bool
	err    error
}

func (p *errorProbe) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed, p.probed, p.held, p.err = nil, false, false, nil
}

func (p *errorProbe) result() (held, probed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.probed
}

func (p *errorProbe) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	p.check(conn)
	return ctx
}

func (p *errorProbe) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (p *errorProbe) TraceBatchEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if data.Err != nil && !conn.IsClosed() {
		p.mu.Lock()
		p.failed = conn
		p.mu.Unlock()
	}
}

func (p *errorProbe) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	p.check(conn)
	return ctx
}

func (p *errorProbe) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// check runs before every statement of the pool; it looks only at the first
// one after a failed batch on the same connection.
func (p *errorProbe) check(conn *pgx.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != conn {
		return
	}
	p.failed = nil
	p.probed = true
	var n int
	p.err = p.monitor.QueryRow(p.ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1",
		conn.PgConn().PID()).Scan(&n)
	p.held = p.err == nil && n > 0
}

// poll checks cond every millisecond until it holds, fails, or limit
// passes: a bounded wait for a database state.
func poll(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %v waiting for %s", limit, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// waitUntil returns at t: it sleeps until shortly before t, then spins.
// The race offsets are tens to hundreds of microseconds, finer than a
// timer sleeps (about 1 ms here); a long spin would starve the server of
// CPU on a small machine and push the grant itself later.
func waitUntil(t time.Time) {
	if d := time.Until(t) - 1500*time.Microsecond; d > 0 {
		time.Sleep(d)
	}
	for time.Now().Before(t) {
		runtime.Gosched()
	}
}
