package advisory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

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

	// Under l.holders.mu:
	held  map[keys.Key]bool  // every key granted or being requested on c: its mode (true: shared)
	locks map[*Lock]struct{} // the held locks whose keys c holds
	gone  bool               // retired or lost: out of l.holders, takes nothing more

	// The turn: whoever holds it may use c; the watcher holds it while it
	// reads. turn is a FIFO semaphore of one slot.
	turn   fifo
	mu     sync.Mutex    // guards inUse, parked
	inUse  int           // callers that hold or wait for the turn (the watcher is not counted)
	parked bool          // the watcher holds the turn, in a read a caller may cut short
	idle   chan struct{} // signalled when inUse drops to 0
	lastOK time.Time     // under the turn: when c last answered

	stop       chan struct{} // closed when c is retired or lost: the watcher ends
	watchStart *time.Timer
	watchDone  chan struct{} // closed when the watcher has returned or will never run
	watchCtx   context.Context
}

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

// newHolder makes c, which holds nothing, or the keys of a when adopted is
// set, a holder connection of l. The caller holds its turn. a's keys are
// recorded on it.
func (l *Locker) newHolder(ctx context.Context, c *pooltx.Conn, a *acquired) *holderConn {
	hc := &holderConn{
		l: l, c: c,
		held:      make(map[keys.Key]bool, len(a.s.all)),
		locks:     make(map[*Lock]struct{}, 1),
		turn:      make(fifo, 1),
		idle:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		watchDone: make(chan struct{}),
		watchCtx:  context.WithoutCancel(ctx),
		lastOK:    time.Now(),
		inUse:     1,
	}
	hc.turn <- struct{}{}
	for _, k := range a.s.all {
		hc.held[k] = a.shared
	}
	l.holders.mu.Lock()
	l.holders.list = append(l.holders.list, hc)
	l.holders.mu.Unlock()
	hc.watchStart = time.AfterFunc(watchDelay, hc.watch)
	return hc
}

// pick returns a holder connection whose record has none of a's keys, with
// a's keys recorded on it, or nil when there is none.
func (l *Locker) pick(a *acquired) *holderConn {
	hs := &l.holders
	hs.mu.Lock()
	defer hs.mu.Unlock()
next:
	for _, hc := range hs.list {
		for _, k := range a.s.all {
			if _, ok := hc.held[k]; ok {
				continue next
			}
		}
		for _, k := range a.s.all {
			hc.held[k] = a.shared
		}
		return hc
	}
	return nil
}

// forget drops a's keys from the record (and h from the locks, when not
// nil); when the record is then empty, hc is taken out of the Locker's set
// and forget reports that the caller, who holds the turn, must retire it.
func (hc *holderConn) forget(a *acquired, h *Lock) (retire bool) {
	hs := &hc.l.holders
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hc.gone {
		return false
	}
	for _, k := range a.s.all {
		delete(hc.held, k)
	}
	if h != nil {
		delete(hc.locks, h)
	}
	if len(hc.held) > 0 {
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
	conn := hc.c.Conn()
	nc := conn.PgConn().Conn()
	_ = nc.SetDeadline(time.Now().Add(hc.l.stmtBound()))
	dctx := context.WithoutCancel(ctx) // pgx does not watch it: the deadline is the bound
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
	_ = nc.SetDeadline(time.Time{})
	if err == nil {
		hc.lastOK = time.Now()
	}
	return falses, err
}

// errGone: the holder connection was retired or lost before the request's
// statement was sent; nothing was done, the request may go elsewhere.
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
			// must still be undone under the turn (it may retire hc).
			_ = hc.take(context.Background())
			if hc.forget(a, nil) {
				hc.retire()
			}
			hc.give()
			return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, noConnection(err))}
		}
	}
	defer hc.give()
	if hc.isGone() {
		return errGone
	}
	falses, err := hc.run(ctx, &a.s, kindTryLock, a.shared)
	switch {
	case err != nil && hc.c.Conn().IsClosed():
		// The session is gone, and with it whatever the statement took.
		hc.lose(err, nil, false)
		if !owned && ctx.Err() == nil && wctx.Err() == nil {
			return errGone // the holder connection died: elsewhere
		}
		return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
	case err != nil:
		// The statement failed on a live connection (a full lock table, a
		// statement_timeout): a multi-key try may have taken some keys.
		hc.undo(ctx, a)
		return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
	case falses > 0:
		if falses < len(a.s.all) {
			hc.undo(ctx, a) // some keys were granted: give them back
		} else if hc.forget(a, nil) {
			hc.retire()
		}
		return &LockError{Op: a.op, Keys: a.s.all, Err: join(ErrNotAcquired, ctx.Err())}
	case ctx.Err() != nil:
		// Granted, but the caller has gone: give it back now.
		hc.undo(ctx, a)
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
	hc.locks[h] = struct{}{}
	hc.l.holders.mu.Unlock()
}

// undo releases whatever a failed or abandoned acquisition of a's keys
// took on hc and drops them from the record; the caller holds the turn.
// Each of a's keys is unlocked once and a false answer ignored: the record
// guarantees that no other lock on hc holds any of them, so true means
// "taken by this acquisition, now released" and false "never taken". If
// the unlock fails, hc is lost.
func (hc *holderConn) undo(ctx context.Context, a *acquired) {
	if hc.c.Conn().IsClosed() {
		hc.lose(errors.New("advisory: connection closed during lock"), nil, false)
		return
	}
	if _, err := hc.run(ctx, &a.s, kindUnlock, a.shared); err != nil {
		hc.lose(&pooltx.CleanupError{Step: "unlock", Err: err}, nil, false)
		return
	}
	if hc.forget(a, nil) {
		hc.retire()
	}
}

// release is Unlock for a lock on hc.
func (hc *holderConn) release(ctx context.Context, h *Lock) error {
	a := h.a
	_ = hc.take(context.Background())
	defer hc.give()
	hc.l.holders.mu.Lock()
	_, mine := hc.locks[h]
	hc.l.holders.mu.Unlock()
	if !mine {
		return h.Err() // lost: the loss set it before passing the turn on
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
		a.span.released(lerr)
		return lerr
	}
	a.span.released(nil)
	if hc.forget(a, h) {
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
	close(hc.stop)
	if byWatcher {
		return
	}
	if hc.watchStart.Stop() {
		close(hc.watchDone) // it never started and never will
	}
	<-hc.watchDone
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
	locks := make([]*Lock, 0, len(hc.locks))
	for h := range hc.locks {
		if h != except {
			locks = append(locks, h)
		}
	}
	hc.locks, hc.held = nil, nil
	hs.mu.Unlock()
	hc.stopWatcher(byWatcher)
	// The holders hear first: they must stop acting as owners at once,
	// and a destroy over a frozen network may take its whole bound.
	for _, h := range locks {
		h.markLost(&LockError{Op: h.a.op, Keys: h.a.s.all, Err: join(ErrLockLost, cause)})
	}
	hc.c.MarkDirty(cause)
	hc.l.unpin(hc.c)
}

// watch runs while hc holds locks. Between statements it holds the turn
// and parks in a read on the idle connection (WaitForNotification), which
// returns at once when the server ends the session or the socket closes;
// a caller that wants the turn cuts the read short. When c has not
// answered for HeartbeatInterval (statements count), a ping bounded by
// HeartbeatTimeout checks that the server still answers.
func (hc *holderConn) watch() {
	defer close(hc.watchDone)
	pg := hc.c.Conn().PgConn()
	nc := pg.Conn()
	interval, timeout := hc.l.cfg.HeartbeatInterval, hc.l.cfg.HeartbeatTimeout
	for {
		// Wait until no caller wants the connection, then for the turn.
		hc.mu.Lock()
		for hc.inUse > 0 {
			hc.mu.Unlock()
			select {
			case <-hc.idle:
			case <-hc.stop:
				return
			}
			hc.mu.Lock()
		}
		hc.mu.Unlock()
		select {
		case hc.turn <- struct{}{}:
		case <-hc.stop:
			return
		}
		select {
		case <-hc.stop:
			hc.turn.unlock()
			return
		default:
		}
		hc.mu.Lock()
		if hc.inUse > 0 {
			hc.mu.Unlock()
			hc.turn.unlock()
			continue
		}
		var deadline time.Time
		if interval > 0 {
			deadline = hc.lastOK.Add(interval)
		}
		var err error
		if deadline.IsZero() || time.Now().Before(deadline) {
			hc.parked = true
			_ = nc.SetReadDeadline(deadline)
			hc.mu.Unlock()
			// context.Background: no pgx context watcher (which could send
			// cancel requests); the read deadline is the only timer.
			err = pg.WaitForNotification(context.Background())
			hc.mu.Lock()
			hc.parked = false
			_ = nc.SetReadDeadline(time.Time{})
		} else {
			err = errHeartbeatDue
		}
		hc.mu.Unlock()

		switch {
		case err == nil: // a notification: nobody LISTENs here; go on
		case (isTimeout(err) || err == errHeartbeatDue) && !pg.IsClosed():
			if interval <= 0 || time.Now().Before(deadline) {
				break // cut short by a caller: let it have the turn
			}
			pctx, cancel := context.WithTimeout(hc.watchCtx, timeout)
			perr := pg.Ping(pctx)
			cancel()
			if perr != nil {
				hc.lose(perr, nil, true)
				hc.turn.unlock()
				return
			}
			hc.lastOK = time.Now()
		default:
			hc.lose(err, nil, true)
			hc.turn.unlock()
			return
		}
		hc.turn.unlock()
	}
}

var errHeartbeatDue = errors.New("advisory: heartbeat due")

// acquireHeld validates ks and takes them for h on a holder connection:
// for a Try call, on one whose record has none of the keys, else on a new
// one; for a blocking call, first by a try on such a holder connection
// (when no call of the Locker waits in its local queue for the first key),
// and when that finds a key busy, by a wait on a connection of its own (the
// local queue, MaxConns and the pool, as WithLock), which, once granted,
// becomes a holder connection. On error nothing is held or pinned.
func (l *Locker) acquireHeld(ctx context.Context, h *Lock, ks []keys.Key, opts *Options, try bool) error {
	a := h.a
	a.shared = opts.shared()
	a.op = opName(sessionOp(try), a.shared)
	if err := a.s.init(ks, l.cfg.MaxKeys); err != nil {
		return &LockError{Op: a.op, Keys: ks, Err: err}
	}
	a.span = &a.sp
	l.initSpan(a.span, ctx, ScopeSession, a.s.all, a.shared, try)
	err := l.acquireHeldTraced(ctx, h, opts, try)
	if err != nil {
		a.span.acquired(err) // success is traced by adopt
	}
	return err
}

func (l *Locker) acquireHeldTraced(ctx context.Context, h *Lock, opts *Options, try bool) error {
	a := h.a
	wctx, stop := l.waitBound(ctx, opts, try)
	defer stop()
	if !try && l.gates.refs(a.s.all[0]) > 0 {
		return l.waitHeld(ctx, wctx, h) // others of the Locker are in line for the key
	}
	for range l.pool.Stat().MaxConns() + 2 {
		hc := l.pick(a)
		if hc == nil {
			break
		}
		err := hc.tryOn(ctx, wctx, h, false)
		switch {
		case errors.Is(err, errGone):
			continue // retired or lost meanwhile: pick again
		case err == nil || try || !errors.Is(err, ErrNotAcquired):
			return err
		}
		return l.waitHeld(ctx, wctx, h) // busy: wait on a connection of its own
	}
	if !try {
		return l.waitHeld(ctx, wctx, h)
	}
	// No holder connection can take the keys: a new one.
	for retried := false; ; retried = true {
		c, err := l.conn(wctx)
		if err != nil {
			return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
		}
		if err := l.checkProxy(ctx, c, a.op, a.s.all); err != nil {
			l.unpin(c)
			return err
		}
		hc := l.newHolder(ctx, c, a)
		err = hc.tryOn(ctx, wctx, h, true)
		if err == nil || retried || !diedIdle(ctx, wctx, c) {
			return err
		}
		// A pooled connection found dead before anything was locked (see
		// diedIdle): once more on another.
	}
}

// waitHeld takes h's keys by a wait on a connection of its own (as
// WithLock does) and makes that connection a holder connection.
func (l *Locker) waitHeld(ctx, wctx context.Context, h *Lock) error {
	a := h.a
	if err := l.acquireSessionWithin(ctx, wctx, a, a.op, a.shared, false); err != nil {
		return err
	}
	hc := l.newHolder(ctx, a.c, a)
	a.c = nil // hc's now
	hc.adopt(h)
	hc.give()
	return nil
}
