package advisory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/internal/cutoff"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// holderConn is the home of held locks that share one pooled connection
// (the default; see Config.DisableMultiplexing). Its rule, in one sentence:
// a holder connection holds each key at most once, in one mode, for one
// lock of its Locker, runs only this package's statements one at a time
// (try-locks, unlocks of its own keys, pings), never waits for a lock, and
// goes back to the pool only when its record is empty and every unlock
// answered true; when it dies, every lock on it is lost.
//
// At most once per key: PostgreSQL's session locks stack within a session
// (a key taken twice is granted twice, and an exclusive request is granted
// to the session that holds the key shared), so two locks of one Locker on
// one connection would not exclude each other. The Locker's record of what
// each holder connection holds (held, under holders.mu) sends a request
// that meets one of its keys there to another holder connection, or a
// connection of its own. Shared requests do not stack either: a shared
// request stacked on a session that holds the key shared would be granted
// ahead of another session's exclusive request queued for it, which a
// request from a session of its own is not.
//
// One statement at a time (the turn, below): an unlock or a ping waits at
// most for the one statement in flight, which never waits for a lock. Each
// statement runs under the Locker's own bound (see stmtBound), never under
// a caller's context, so a caller that gives up cannot make pgx cancel or
// close the connection under the other holders; a result that arrives after
// the caller gave up is settled before the turn is passed on (a key granted
// to nobody is unlocked).
type holderConn struct {
	l *Locker
	c *pooltx.Conn

	// Under l.holders.mu, the record: every lock whose keys c holds or is
	// being asked for (pending), linked through Lock.prev and Lock.next,
	// with an index of their keys once there are more than indexFrom.
	first *Lock
	nkeys int
	index map[keys.Key]struct{}
	gone  bool // retired or lost: out of l.holders, takes nothing more

	// The turn: whoever holds it may use c; the watcher holds it while it
	// reads. turn is a FIFO semaphore of one slot.
	turn     fifo
	mu       sync.Mutex    // guards inUse, parked, idle, stop, stopping
	inUse    int           // callers that hold or wait for the turn (the watcher is not counted)
	parked   bool          // the watcher holds the turn, in a read a caller may cut short
	idle     chan struct{} // signalled when inUse drops to 0; made by the watcher
	stop     chan struct{} // closed when c is retired or lost; made by the watcher
	stopping bool          // stopWatcher has run: a watcher starting now returns at once
	lastOK   time.Time     // under the turn: when c last answered

	watchStart cutoff.Bound   // starts the watcher (see watchDelay)
	watchDone  sync.WaitGroup // counts the watcher until it has returned or can no longer run
	watchCtx   detached       // the first acquisition's values, never cancelled
	stmtCtx    detached       // the context of the statement in flight (under the turn)
	bound      cutoff.Bound   // the bound of the statement in flight (under the turn)
	cut        bool           // the last statement's bound passed before it was over (under the turn)
}

// indexFrom is how many keys a holder connection's record holds before it
// keeps an index of them; below it a request's keys are compared with each
// lock's.
const indexFrom = 8

// holders is a Locker's set of shared holder connections.
type holders struct {
	mu   sync.Mutex
	list []*holderConn
}

// stmtBound is the bound of one statement on a holder connection: the
// cleanup timeout, and, when heartbeats are on, at most HeartbeatTimeout
// (a holder connection that does not answer a statement in that time has
// the frozen server or partition a ping would find).
func (l *Locker) stmtBound() time.Duration {
	d := l.cfg.CleanupTimeout
	if l.cfg.HeartbeatInterval > 0 && l.cfg.HeartbeatTimeout < d {
		d = l.cfg.HeartbeatTimeout
	}
	return d
}

// Beyond the first boundFreeKeys keys of one statement, each key adds
// perKeyBound to its bound on a holder connection (stmtBoundFor): the
// server's own time for a key, with room to spare. Unlocking a key that is
// not held costs a WARNING, about 7 us a key on a 2-core machine, and the
// undo of a large multi-key try that failed part-way (53200) unlocks every
// key of the call: with Config.MaxKeys raised far above the default, that
// outlasted a bound meant to tell a frozen server, and the holder
// connection was lost with every other lock on it.
const (
	boundFreeKeys = 1000
	perKeyBound   = 20 * time.Microsecond
)

// stmtBoundFor is stmtBound for a statement over n keys.
func (l *Locker) stmtBoundFor(n int) time.Duration {
	d := l.stmtBound()
	if n > boundFreeKeys {
		d += time.Duration(n-boundFreeKeys) * perKeyBound
	}
	return d
}

// newHolder makes c a holder connection of l with h recorded on it
// (pending: its keys are being asked for, or, for a connection that waited
// for them, granted and about to be adopted). The caller holds its turn.
func (l *Locker) newHolder(ctx context.Context, c *pooltx.Conn, h *Lock) *holderConn {
	hc := l.openHolder(h)
	hc.attach(ctx, c)
	return hc
}

// openHolder records h, pending, on a new holder connection that has no
// connection yet, and puts it in the Locker's set at once: calls that come
// while the caller, who holds its turn, gets it a connection (attach) pick
// it and wait for its turn instead of each opening a connection of its
// own. If no connection comes, the caller abandons it.
func (l *Locker) openHolder(h *Lock) *holderConn {
	hc := l.emptyHolder()
	l.holders.mu.Lock()
	hc.link(h)
	l.holders.list = append(l.holders.list, hc)
	l.holders.mu.Unlock()
	return hc
}

// emptyHolder returns a holder connection with no connection and nothing
// recorded, its turn held by the caller.
func (l *Locker) emptyHolder() *holderConn {
	hc := &holderConn{
		l:      l,
		turn:   make(fifo, 1),
		lastOK: time.Now(),
		inUse:  1,
	}
	hc.turn <- struct{}{}
	return hc
}

// pickOrOpen is pick and, when no holder connection can take h's keys,
// openHolder, under one hold of holders.mu: of the calls that find none
// at the same moment only the first opens one, and the others pick it
// (opened false) and wait for its turn. With pick and openHolder apart,
// every call that found none before the first had recorded its new
// holder opened one too: 50 concurrent first TryLocks pinned three
// connections under load.
func (l *Locker) pickOrOpen(h *Lock) (hc *holderConn, opened bool) {
	hs := &l.holders
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, hc := range hs.list {
		if !hc.hasAny(h.a.s.all) {
			hc.link(h)
			return hc, false
		}
	}
	hc = l.emptyHolder()
	hc.link(h)
	hs.list = append(hs.list, hc)
	return hc, true
}

// attach gives hc, opened by openHolder, its connection and starts its
// watcher; the caller holds the turn (so those waiting for it see c once
// they have it).
func (hc *holderConn) attach(ctx context.Context, c *pooltx.Conn) {
	hc.c = c
	hc.lastOK = time.Now()
	hc.watchCtx.parent = ctx
	hc.watchDone.Add(1)
	hc.watchStart.StartExpiry((*holderStarter)(hc), watchDelay) // the shared timer: see dedicated.start
}

// holderStarter starts the watcher of a holder connection once watchDelay
// has passed.
type holderStarter holderConn

func (w *holderStarter) Expire() { go (*holderConn)(w).watch() }

// abandon ends hc, opened by openHolder, that got no connection: it leaves
// the set, and every lock recorded on it (all pending: h's and those of the
// calls that picked it meanwhile) is dropped from the record, so that
// those calls, once they have the turn, find it gone and go elsewhere. The
// caller holds the turn and passes it on.
func (hc *holderConn) abandon() {
	hs := &hc.l.holders
	hs.mu.Lock()
	hc.gone = true
	hs.remove(hc)
	for h := hc.first; h != nil; {
		next := h.next
		h.on, h.prev, h.next = nil, nil, nil
		h = next
	}
	hc.first, hc.index, hc.nkeys = nil, nil, 0
	hs.mu.Unlock()
	hc.give()
}

// pick returns a holder connection whose record has none of h's keys, with
// h recorded on it (pending), or nil when there is none.
func (l *Locker) pick(h *Lock) *holderConn {
	hs := &l.holders
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, hc := range hs.list {
		if !hc.hasAny(h.a.s.all) {
			hc.link(h)
			return hc
		}
	}
	return nil
}

// hasAny reports whether the record of hc has any of ks, in any mode;
// holders.mu is held.
func (hc *holderConn) hasAny(ks []keys.Key) bool {
	if hc.index != nil {
		for _, k := range ks {
			if _, ok := hc.index[k]; ok {
				return true
			}
		}
		return false
	}
	for o := hc.first; o != nil; o = o.next {
		for _, k := range o.a.s.all {
			if slices.Contains(ks, k) {
				return true
			}
		}
	}
	return false
}

// link records h on hc, pending; holders.mu is held.
func (hc *holderConn) link(h *Lock) {
	h.on, h.pending = hc, true
	h.prev, h.next = nil, hc.first
	if hc.first != nil {
		hc.first.prev = h
	}
	hc.first = h
	hc.nkeys += len(h.a.s.all)
	switch {
	case hc.index != nil:
		for _, k := range h.a.s.all {
			hc.index[k] = struct{}{}
		}
	case hc.nkeys > indexFrom:
		hc.index = make(map[keys.Key]struct{}, 2*hc.nkeys)
		for o := hc.first; o != nil; o = o.next {
			for _, k := range o.a.s.all {
				hc.index[k] = struct{}{}
			}
		}
	}
}

// unlink drops h from the record of hc; holders.mu is held.
func (hc *holderConn) unlink(h *Lock) {
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		hc.first = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	}
	h.on, h.prev, h.next = nil, nil, nil
	hc.nkeys -= len(h.a.s.all)
	if hc.index != nil {
		for _, k := range h.a.s.all {
			delete(hc.index, k)
		}
	}
}

// forget drops h from the record; when the record is then empty, hc is
// taken out of the Locker's set and forget reports that the caller, who
// holds the turn, must retire it.
func (hc *holderConn) forget(h *Lock) (retire bool) {
	hs := &hc.l.holders
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hc.gone || h.on != hc {
		return false
	}
	hc.unlink(h)
	if hc.first != nil {
		return false
	}
	hc.gone = true
	hs.remove(hc)
	return true
}

// remove takes hc out of the set; hs.mu is held.
func (hs *holders) remove(hc *holderConn) {
	if i := slices.Index(hs.list, hc); i >= 0 {
		hs.list = slices.Delete(hs.list, i, i+1)
	}
}

// isGone reports whether hc was retired or lost.
func (hc *holderConn) isGone() bool {
	hc.l.holders.mu.Lock()
	defer hc.l.holders.mu.Unlock()
	return hc.gone
}

// take waits for the turn, bounded by ctx; give passes it on.
func (hc *holderConn) take(ctx context.Context) error {
	hc.mu.Lock()
	hc.inUse++
	if hc.parked {
		// Cut the watcher's read short: it passes the turn on.
		_ = hc.c.Conn().PgConn().Conn().SetReadDeadline(time.Now())
	}
	hc.mu.Unlock()
	if err := hc.turn.lock(ctx); err != nil {
		hc.unuse()
		return err
	}
	return nil
}

func (hc *holderConn) give() {
	hc.turn.unlock()
	hc.unuse()
}

func (hc *holderConn) unuse() {
	hc.mu.Lock()
	if hc.inUse--; hc.inUse == 0 {
		select {
		case hc.idle <- struct{}{}:
		default:
		}
	}
	hc.mu.Unlock()
}

// run applies kind to the keys of s on hc's connection, under the
// Locker's bound, and returns how many keys answered false. The caller
// holds the turn.
func (hc *holderConn) run(ctx context.Context, s *keySet, k kind, shared bool) (falses int, err error) {
	return hc.runWithin(ctx, s, k, shared, hc.l.stmtBoundFor(len(s.all)))
}

// runWithin is run with the statement bounded by d.
func (hc *holderConn) runWithin(ctx context.Context, s *keySet, k kind, shared bool, d time.Duration) (falses int, err error) {
	conn := hc.c.Conn()
	nc := conn.PgConn().Conn()
	hc.bound.Start(nc, d) // no socket deadline, no timer of its own
	done := false
	defer func() {
		if !done {
			// The statement panicked (a pgx QueryTracer's or BatchTracer's
			// panic, say): what it took or left on the session is
			// unknown. The session ends with the socket, which releases
			// every lock on it, and each of them is lost; the panic goes
			// on up.
			hc.cut = !hc.bound.End()
			_ = nc.Close()
			hc.lose(errStatementPanicked, nil, false)
		}
	}()
	hc.stmtCtx.parent = ctx
	dctx := &hc.stmtCtx // cannot end, so pgx does not watch it: the deadline is the bound
	if len(s.all) == 1 {
		var ok bool
		sql, args := s.one(k, shared, "")
		err = conn.QueryRow(dctx, sql, args...).Scan(&ok)
		if err == nil && !ok {
			falses = 1
		}
	} else {
		b := &pgx.Batch{}
		s.queue(b, k, shared, 0, boolResults(&falses))
		err = conn.SendBatch(dctx, b).Close()
	}
	done = true
	hc.cut = !hc.bound.End()
	if err == nil {
		hc.lastOK = time.Now()
	}
	return falses, err
}

// errStatementPanicked: a statement of the library's panicked on the
// connection (in pgx, in a tracer or hook of the pool's): the connection,
// and whatever it holds, is destroyed.
var errStatementPanicked = errors.New("advisory: a statement panicked on the connection (a pgx tracer or hook?); connection destroyed")

// errGone: the holder connection was retired or lost before the request's
// statement was sent, or died under it (then chained with the call's
// error); nothing is held, the request may go elsewhere.
var errGone = errors.New("advisory: holder connection gone")

// tryOn tries a's keys, recorded on hc by pick or newHolder, on hc, and on
// success records h as one of its locks. The caller holds the turn when
// owned is set; tryOn passes it on either way. On any failure a's keys are
// dropped from the record and nothing of them stays held on hc (or hc is
// lost).
func (hc *holderConn) tryOn(ctx, wctx context.Context, h *Lock, owned bool) error {
	a := h.a
	if !owned {
		if err := hc.take(wctx); err != nil {
			// Given up waiting for the turn: nothing was sent. The record
			// is undone now (under holders.mu); if that leaves hc without
			// locks, hc is retired under the turn, which the one holding it
			// may keep for a while (the watcher, through a heartbeat the
			// network delays, up to HeartbeatTimeout): in the background,
			// so that the call returns within its bound.
			if hc.forget(h) {
				go func() {
					_ = hc.take(context.Background())
					hc.retire()
					hc.give()
				}()
			}
			return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, noConnection(err))}
		}
	}
	defer hc.give()
	if hc.isGone() {
		return errGone
	}
	d := hc.l.stmtBoundFor(len(a.s.all))
	if owned {
		// A connection opened for this call holds nothing else: its
		// statement, which waits for no lock, is bounded as a Try call's
		// (TryWithLock), since cutting it short loses no other lock.
		d = min(d, hc.l.tryConnWait())
	}
	falses, err := hc.runWithin(ctx, &a.s, kindTryLock, a.shared, d)
	if err != nil && hc.cut {
		// The server did not answer within the statement's bound: hc is
		// cut off, and the call could not be served (its statement waits
		// for no lock).
		err = noConnection(join(err, context.DeadlineExceeded))
	}
	switch {
	case err != nil && hc.c.Conn().IsClosed():
		// The session is gone, and with it whatever the statement took.
		hc.lose(err, nil, false)
		lerr := &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
		if ctx.Err() == nil && wctx.Err() == nil {
			// Nothing is held by a dead session: the call may go elsewhere.
			return chain{errGone, lerr}
		}
		return lerr
	case err != nil:
		// The statement failed on a live connection (a full lock table, a
		// statement_timeout): a multi-key try may have taken some keys.
		hc.undo(ctx, h)
		return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
	case falses > 0:
		if falses < len(a.s.all) {
			hc.undo(ctx, h) // some keys were granted: give them back
		} else if hc.forget(h) {
			hc.retire()
		}
		return &LockError{Op: a.op, Keys: a.s.all, Err: join(ErrNotAcquired, ctx.Err())}
	case ctx.Err() != nil:
		// Granted, but the caller has gone: give it back now.
		hc.undo(ctx, h)
		return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, ctx.Err())}
	}
	hc.adopt(h)
	return nil
}

// adopt makes h, whose keys hc now holds, one of hc's locks, after
// tracing its acquisition (a loss found later is traced after it); the
// caller holds the turn.
func (hc *holderConn) adopt(h *Lock) {
	h.a.span.acquired(nil)
	h.home = hc
	hc.l.holders.mu.Lock()
	h.pending = false
	hc.l.holders.mu.Unlock()
}

// undo releases whatever a failed or abandoned acquisition of a's keys
// took on hc and drops them from the record; the caller holds the turn.
// Each of a's keys is unlocked once and a false answer ignored: the record
// guarantees that no other lock on hc holds any of them, so true means
// "taken by this acquisition, now released" and false "never taken". If
// the unlock fails, hc is lost.
func (hc *holderConn) undo(ctx context.Context, h *Lock) {
	a := h.a
	if hc.c.Conn().IsClosed() {
		hc.lose(errors.New("advisory: connection closed during lock"), nil, false)
		return
	}
	if _, err := hc.run(ctx, &a.s, kindUnlock, a.shared); err != nil {
		hc.lose(&pooltx.CleanupError{Step: "unlock", Err: err}, nil, false)
		return
	}
	if hc.forget(h) {
		hc.retire()
	}
}

// release is Unlock for a lock on hc.
func (hc *holderConn) release(ctx context.Context, h *Lock) error {
	a := h.a
	hc.l.holders.mu.Lock()
	mine := h.on == hc
	hc.l.holders.mu.Unlock()
	if !mine {
		// Lost, or being lost: the loss holds the turn while it marks each
		// lock, and may be running this Unlock from a LostTracer. Waiting
		// for the turn would wait for ourselves.
		return h.lostErr()
	}
	_ = hc.take(context.Background())
	// The release is traced once the turn is given back: a ReleaseTracer
	// that unlocks another lock of hc (which waits for the turn) must not
	// wait for this one.
	var released bool
	var releaseErr error
	defer func() {
		hc.give()
		if released {
			a.span.released(releaseErr)
		}
	}()
	hc.l.holders.mu.Lock()
	mine = h.on == hc
	hc.l.holders.mu.Unlock()
	if !mine {
		return h.lostErr() // lost meanwhile
	}
	falses, err := hc.run(ctx, &a.s, kindUnlock, a.shared)
	switch {
	case err != nil:
		// The session is gone, or its state unknown (the bound closed the
		// socket): every lock on it, this one included, is lost.
		hc.lose(&pooltx.CleanupError{Step: "unlock", Err: err}, nil, false)
		return h.Err()
	case falses > 0:
		// The record said hc held the keys: it is wrong or the session was
		// lost and replaced. Either way the connection is in doubt.
		lerr := &LockError{Op: opName(kindUnlock, a.shared), Keys: a.s.all, Err: ErrNotHeld}
		hc.lose(fmt.Errorf("advisory: an unlock on the shared holder connection found a key not held: %w", ErrNotHeld), h, false)
		released, releaseErr = true, lerr
		return lerr
	}
	released = true
	if hc.forget(h) {
		hc.retire()
	}
	return nil
}

// retire gives back hc, taken out of the set with an empty record by
// forget; the caller holds the turn. Every key it took was unlocked with a
// true answer and only this package's statements ran on it: it is clean.
func (hc *holderConn) retire() {
	hc.stopWatcher(false)
	hc.c.MarkClean()
	hc.l.unpin(hc.c)
}

// stopWatcher ends the watcher and, unless called by it, waits for it.
func (hc *holderConn) stopWatcher(byWatcher bool) {
	hc.mu.Lock()
	hc.stopping = true
	if hc.stop != nil {
		close(hc.stop)
	}
	hc.mu.Unlock()
	if byWatcher {
		return
	}
	if hc.watchStart.End() {
		hc.watchDone.Done() // it never started and never will
	}
	hc.watchDone.Wait()
}

// lose ends hc after its connection died or fell in doubt: every lock on
// it but except is lost (each traced once, its Done closed, its Err
// matching ErrLockLost and wrapping cause), and the connection is
// destroyed. The caller holds the turn (the watcher holds it while it
// reads); byWatcher says that it is the watcher.
func (hc *holderConn) lose(cause error, except *Lock, byWatcher bool) {
	hs := &hc.l.holders
	hs.mu.Lock()
	if hc.gone {
		hs.mu.Unlock()
		return
	}
	hc.gone = true
	hs.remove(hc)
	var locks []*Lock
	for h := hc.first; h != nil; {
		next := h.next
		if h != except && !h.pending {
			locks = append(locks, h)
			// Before anyone can see h gone: an Unlock that finds it so
			// returns this loss (see Lock.pendingLoss).
			h.setPendingLoss(&LockError{Op: h.a.op, Keys: h.a.s.all, Err: join(ErrLockLost, cause)})
		}
		h.on, h.prev, h.next = nil, nil, nil
		h = next
	}
	hc.first, hc.index, hc.nkeys = nil, nil, 0
	hs.mu.Unlock()
	hc.stopWatcher(byWatcher)
	// The holders hear first: they must stop acting as owners at once,
	// and a destroy over a frozen network may take its whole bound.
	for _, h := range locks {
		h.markLost(h.pendingLossErr())
	}
	hc.c.MarkDirty(cause)
	hc.l.unpin(hc.c)
}
