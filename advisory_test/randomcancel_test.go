package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// exclusion tracks, per key, the critical sections inside it, and records a conflict
// when an exclusive holder meets anybody or a shared holder meets an exclusive one.
// Sections exit before they release, so the record never lags behind the lock.
//
// Two conflicts are not the library's, and are excused (counted, not failed): the
// holder's lock went while its callback was still returning, because
//   - its connection closed (pgx's default context handler closes it when a query is
//     cancelled), which ends the session and its locks; or
//   - a statement of its transaction failed (a cancel answered 57014): PostgreSQL aborts
//     the transaction and releases its locks at the error, not at ROLLBACK.
//
// Such a section is marked lockGone at exit; a conflict whose holders are all lockGone
// is excused.
type exclusion struct {
	mu        sync.Mutex
	in        map[keys.Key]map[*section]bool
	conflicts []conflict
}

type section struct {
	op       string
	shared   bool
	lockGone bool // the lock may have gone inside the section (under mu)
}

type conflict struct {
	entrant string
	key     keys.Key
	shared  bool
	holders []*section
}

func newExclusion() *exclusion { return &exclusion{in: map[keys.Key]map[*section]bool{}} }

func (e *exclusion) enter(op string, ks []keys.Key, shared bool) *section {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &section{op: op, shared: shared}
	for _, k := range ks {
		var clash []*section
		for h := range e.in[k] {
			if !shared || !h.shared {
				clash = append(clash, h)
			}
		}
		if len(clash) > 0 {
			e.conflicts = append(e.conflicts, conflict{entrant: op, key: k, shared: shared, holders: clash})
		}
		if e.in[k] == nil {
			e.in[k] = map[*section]bool{}
		}
		e.in[k][s] = true
	}
	return s
}

func (e *exclusion) exit(s *section, ks []keys.Key, lockGone bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.lockGone = lockGone
	for _, k := range ks {
		delete(e.in[k], s)
	}
}

// violations returns the conflicts not excused, and how many were excused.
func (e *exclusion) violations() (real []string, excused int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conflicts {
		var live []string
		for _, h := range c.holders {
			if !h.lockGone {
				live = append(live, fmt.Sprintf("%s (shared=%v)", h.op, h.shared))
			}
		}
		if len(live) == 0 {
			excused++
			continue
		}
		real = append(real, fmt.Sprintf("%s entered %v (shared=%v) while %v held it", c.entrant, c.key, c.shared, live))
	}
	return real, excused
}

// leakWatch is an AfterRelease hook: every connection going back to the pool is checked
// in pg_locks; one that still holds an advisory lock is counted and destroyed.
type leakWatch struct {
	checked atomic.Int64
	mu      sync.Mutex
	leaks   []string
}

func (w *leakWatch) afterRelease(conn *pgx.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	var which string
	err := conn.QueryRow(ctx, `SELECT count(*), coalesce(string_agg(format('%s/%s/%s %s', classid, objid, objsubid, mode), ', '), '')
		FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'`).Scan(&n, &which)
	if err != nil {
		return false // cannot tell: do not reuse it
	}
	w.checked.Add(1)
	if n > 0 {
		w.mu.Lock()
		w.leaks = append(w.leaks, fmt.Sprintf("pid %d returned to the pool holding %s", conn.PgConn().PID(), which))
		w.mu.Unlock()
		return false
	}
	return true
}

// outcome counts, per operation, how calls ended.
type outcome struct {
	mu         sync.Mutex
	counts     map[string]int
	unexpected []string
}

func (o *outcome) add(op, result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[op+": "+result]++
}

func (o *outcome) bad(op string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unexpected = append(o.unexpected, fmt.Sprintf("%s: %v", op, err))
}

// classifyResult sorts an operation's error into expected outcomes; anything else is a
// failure of the test. ErrNotHeld, ErrLockLost or a panic would be a library bug here.
//
// One outcome is not a failure of what this test checks (no leak, no double holder) but
// is reported: a 57014 in a call whose own context never ended. A cancel request sent
// for an earlier call on the same pooled connection (by pgx's cancel-request handler,
// or by the library when it cancels a lock wait) reached the backend late, as
// PostgreSQL handles the signal asynchronously, and cancelled this call's statement.
func classifyResult(err error, try, deadline bool) (string, bool) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "ok", true
	case errors.Is(err, advisory.ErrNotHeld), errors.Is(err, advisory.ErrLockLost):
		return "", false
	case try && errors.Is(err, advisory.ErrNotAcquired):
		return "not acquired", true
	case try && errors.Is(err, advisory.ErrNoConnection):
		// The pool was busy with the other callers past the bound a Try call
		// waits for a connection (DefaultTryConnWait).
		return "no connection", true
	case deadline && errors.Is(err, advisory.ErrLockTimeout):
		return "lock timeout", true
	case errors.Is(err, context.Canceled):
		return "cancelled", true
	case deadline && errors.Is(err, context.DeadlineExceeded):
		return "deadline", true
	case errors.As(err, &pgErr) && pgErr.Code == "57014":
		// Not context.Canceled (the case above): the library and our callbacks put the
		// context's error in the chain whenever the call's own context ended.
		return staleCancel, true
	}
	return "", false
}

// staleCancel names the outcome described at classifyResult.
const staleCancel = "STALE CANCEL (57014 with the call's context live)"

// 1,000 acquisitions under contention on three keys, each with a context cancelled (or
// timing out) at a random point: before the call, while waiting for a connection or the
// lock, just as the lock is granted, inside the callback, during unlock or commit. Two
// pools, one with pgx's default context handler (closes the connection) and one with the
// cancel-request handler (keeps it). Nothing may leak: no lock left in pg_locks, no
// connection returned to a pool holding a lock (checked at every release), no connection
// left acquired, and no two holders ever inside one key's critical section. The history of
// acquisitions and releases is checked for linearizability against history.LockModel.
func TestRandomCancellation(t *testing.T) {
	const total = 1000
	const workers = 12
	ctx := testCtx(t)

	var watches []*leakWatch
	var pools []*pgxpool.Pool
	for _, cancelRequest := range []bool{false, true} {
		cfg := pgtest.Config(t)
		cfg.MaxConns = 6
		w := &leakWatch{}
		cfg.AfterRelease = w.afterRelease
		if cancelRequest {
			cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: time.Second}
			}
		}
		pools = append(pools, pgtest.NewPool(t, cfg))
		watches = append(watches, w)
	}
	lockers := []*advisory.Locker{
		newLocker(t, pools[0], advisory.Config{}),
		newLocker(t, pools[1], advisory.Config{}),
	}
	ks := []keys.Key{int64Key(t), int64Key(t), pairKey(t)}

	excl := newExclusion()
	rec := history.NewRecorder("test", nil)
	out := &outcome{counts: map[string]int{}}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := next.Add(1); i <= total; i = next.Add(1) {
				runRandomOp(ctx, rng, lockers[w%2], w%2 == 1, ks, excl, out, rec, fmt.Sprintf("w%d/op%d", w, i))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	byOp := map[string][]string{}
	for k, n := range out.counts {
		op, result, _ := strings.Cut(k, ": ")
		byOp[op] = append(byOp[op], fmt.Sprintf("%s=%d", result, n))
	}
	var summary []string
	for op, results := range byOp {
		sort.Strings(results)
		summary = append(summary, fmt.Sprintf("  %s: %s", op, strings.Join(results, ", ")))
	}
	sort.Strings(summary)
	t.Logf("%d operations in %v:\n%s", total, elapsed.Round(time.Millisecond), strings.Join(summary, "\n"))
	assert.Empty(t, out.unexpected, "unexpected errors")
	stale := map[string]int{}
	for k, n := range out.counts {
		if strings.HasSuffix(k, ": "+staleCancel) {
			pool := "default handler"
			if strings.Contains(k, "(cancel-request handler)") {
				pool = "cancel-request handler"
			}
			stale[pool] += n
		}
	}
	if len(stale) > 0 {
		t.Logf("calls failed with 57014 although their own context never ended (a late cancel request meant for an earlier call on the same connection): %v", stale)
	}
	// Regression: the library's own cancel requests (sent when a lock wait is
	// cancelled) must never reach a later statement. A connection on which
	// one may still be pending is destroyed, not pooled. (pgx's cancel-request
	// handler can still do this to the other pool's callbacks: not ours.)
	assert.Zero(t, stale["default handler"], "a late cancel request of the library hit another statement")
	violations, excused := excl.violations()
	assert.Empty(t, violations, "mutual exclusion violated")
	history.Check(t, history.LockModel(), rec.Ops())
	t.Logf("excused overlaps (the holder's lock went inside its callback: connection closed or transaction aborted): %d", excused)
	for i, pool := range pools {
		handler := []string{"default", "cancel-request"}[i]
		if n := pool.Stat().AcquiredConns(); n > 0 {
			t.Logf("%s handler pool: %d connections still being released in the background", handler, n)
		}
		// A release finishes in the background (the AfterRelease check, or a ping pgxpool
		// abandoned when an Acquire was cancelled): give those a moment.
		assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 5*time.Millisecond,
			"%s handler pool: %d connections still acquired", handler, pool.Stat().AcquiredConns())
		assert.Empty(t, watches[i].leaks, "%s handler pool: connections returned holding locks", handler)
		st := pool.Stat()
		t.Logf("%s handler pool: %d releases checked in pg_locks; %d connections opened, %d of them closed (destroyed after a cancel, a dirty state or a failed check)",
			handler, watches[i].checked.Load(), st.NewConnsCount(), st.NewConnsCount()-int64(st.TotalConns()))
		pgtest.AssertNoAdvisoryLocks(t, pool)
	}
	// Idle connections hold nothing either (the end-of-test check of each pool repeats
	// this through pg_locks by application_name).
	for _, pool := range pools {
		for _, c := range pool.AcquireAllIdle(ctx) {
			var n int
			require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'").Scan(&n))
			assert.Zero(t, n)
			c.Release()
		}
	}
}

// runRandomOp runs one randomly chosen acquisition with a randomly ending context, and
// records it in rec as client.
func runRandomOp(parent context.Context, rng *rand.Rand, l *advisory.Locker, cancelRequest bool, all []keys.Key, excl *exclusion, out *outcome,
	rec *history.Recorder, client string) {
	// When the context ends: already (5%), never (15%), at a deadline (15%), or by a
	// cancel after 0-10 ms (65%): through connection acquisition, the lock wait, the
	// grant, the callback, the unlock or the commit.
	var ctx context.Context
	var cancel context.CancelFunc
	deadline := false
	delay := time.Duration(rng.Int64N(int64(10 * time.Millisecond)))
	switch p := rng.IntN(100); {
	case p < 5:
		ctx, cancel = context.WithCancel(parent)
		cancel()
	case p < 20:
		ctx, cancel = context.WithCancel(parent)
	case p < 35:
		ctx, cancel = context.WithTimeout(parent, delay)
		deadline = true
	default:
		ctx, cancel = context.WithCancel(parent)
		stop := time.AfterFunc(delay, cancel)
		defer stop.Stop()
	}
	defer cancel()

	k := all[rng.IntN(len(all))]
	subset := randomSubset(rng, all)
	shared := rng.IntN(4) == 0
	opts := &advisory.Options{Shared: shared}
	// work runs inside a section: half the time a short query on the lock's connection
	// or transaction, which a cancellation may interrupt.
	work := func(ctx context.Context, q sectionConn) error {
		if q == nil || rng.IntN(2) == 0 {
			return nil
		}
		if _, err := q.Exec(ctx, "SELECT pg_sleep(0.0005)"); err != nil {
			if ctx.Err() != nil {
				return errors.Join(err, ctx.Err())
			}
			return err
		}
		return nil
	}
	// The history: the acquisition returns when its section starts, the release starts
	// when the section ends; a section whose lock may have gone inside it records a
	// Lost. a is set before the call.
	var a *attempt
	// section runs work inside the exclusion record. closed reports whether the lock's
	// connection has closed; xact says whether q is a transaction.
	section := func(op string, ks []keys.Key, shared bool, q sectionConn, closed func() bool, xact bool) error {
		a.acquired()
		s := excl.enter(op, ks, shared)
		err := work(ctx, q)
		lockGone := (closed != nil && closed()) || (xact && err != nil)
		excl.exit(s, ks, lockGone)
		if lockGone {
			a.lost(0)
		}
		a.releasing()
		return err
	}

	var op string
	var try bool
	var err error
	one := []keys.Key{k}
	sess := func(ks []keys.Key) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error { return section(op, ks, shared, c, c.IsClosed, false) }
	}
	xact := func(ks []keys.Key) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			return section(op, ks, shared, tx, tx.Conn().IsClosed, true)
		}
	}
	choice := rng.IntN(9)
	switch choice {
	case 0, 1, 3, 4:
		a = beginAttempt(rec, client, one, shared)
	default:
		a = beginAttempt(rec, client, subset, shared)
	}
	switch choice {
	case 0:
		op = "WithLock"
		err = l.WithLock(ctx, k, opts, sess(one))
	case 1:
		op, try = "TryWithLock", true
		err = l.TryWithLock(ctx, k, opts, sess(one))
	case 2:
		op = "WithLockAll"
		err = l.WithLockAll(ctx, subset, opts, sess(subset))
	case 3:
		op = "WithXactLock"
		err = l.WithXactLock(ctx, k, opts, xact(one))
	case 4:
		op, try = "TryWithXactLock", true
		err = l.TryWithXactLock(ctx, k, opts, xact(one))
	case 5:
		op = "WithXactLockAll"
		err = l.WithXactLockAll(ctx, subset, opts, xact(subset))
	case 6:
		op, try = "TryWithLockAll", true
		err = l.TryWithLockAll(ctx, subset, opts, sess(subset))
	case 7:
		op = "Lock+Unlock"
		var h *advisory.Lock
		h, err = l.LockAll(ctx, subset, opts)
		if err == nil {
			_ = section(op, subset, shared, nil, nil, false)
			err = h.Unlock(ctx)
			a.released(err == nil)
		}
	case 8:
		op = "Hold"
		err = l.HoldAll(ctx, subset, opts, func(ctx context.Context) error {
			a.acquired()
			s := excl.enter(op, subset, shared)
			defer a.releasing()
			defer excl.exit(s, subset, false)
			select {
			case <-ctx.Done(): // the caller's cancellation reaches the callback
				return ctx.Err()
			case <-time.After(time.Duration(rng.Int64N(int64(2 * time.Millisecond)))):
				return nil
			}
		})
	}
	if cancelRequest {
		op += " (cancel-request handler)"
	}
	a.released(err == nil)
	a.failed(attemptOutcome(err))
	result, ok := classifyResult(err, try, deadline)
	if !ok {
		out.bad(op, err)
		return
	}
	out.add(op, result)
}

// sectionConn is what a critical section queries: the lock's *pgx.Conn or pgx.Tx.
type sectionConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// randomSubset returns 1 to 3 of the keys, in random order (the library sorts them).
func randomSubset(rng *rand.Rand, all []keys.Key) []keys.Key {
	s := append([]keys.Key(nil), all...)
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s[:1+rng.IntN(len(s))]
}

// attemptOutcome is the history's outcome of an acquisition that did not return the
// lock: Busy for a try the server refused, Timeout for a wait the server's lock_timeout
// ended (55P03: the key was held when the wait began), else Unknown.
func attemptOutcome(err error) history.Outcome {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, advisory.ErrNotAcquired):
		return history.Busy
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return history.Timeout
	}
	return history.Unknown
}
