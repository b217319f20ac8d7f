package advisory

import (
	"context"
	"errors"

	"github.com/pgxlock/pgxlock/pooltx"
)

// The acquisition of held locks on shared holder connections (see
// holderConn in shared.go; its watcher is in holderwatch.go).

// pickTries bounds how many holder connections one call tries that turn
// out gone (retired, lost) under it before it takes another way.
const pickTries = 8

// acquireHeld takes the keys of h's request (h.a.request, set by the
// call's entry point) for h on a holder connection: for a Try call, on one whose record has none of the keys, else on a new
// one; for a blocking call, first by a try on such a holder connection
// (when no call of the Locker waits in its local queue for the first key),
// and when that finds a key busy, or no holder connection can take the
// keys, by a wait on a connection of its own (the
// local queue, MaxConns and the pool, as WithLock), which, once granted,
// becomes a holder connection. On error nothing is held or pinned.
func (l *Locker) acquireHeld(ctx context.Context, h *Lock) error {
	a := h.a
	a.span = &a.sp
	l.initSpan(a.span, ctx, ScopeSession, a.s.all, a.shared, a.try)
	defer a.span.endCut(a.op) // a panic; success is traced by adopt, as below
	err := l.acquireHeldTraced(ctx, h)
	if err != nil {
		a.span.acquired(err) // success is traced by adopt
	}
	return err
}

func (l *Locker) acquireHeldTraced(ctx context.Context, h *Lock) error {
	a := h.a
	try := a.try
	wctx := l.waitCtx(ctx, a)
	defer a.bw.stop()
	if !try && l.gates.refs(a.s.all[0]) > 0 {
		return l.waitHeld(ctx, wctx, h) // others of the Locker are in line for the key
	}
	for range pickTries {
		hc := l.pick(h)
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
	// No holder connection can take the keys: a new one, which the calls
	// that come while it connects share (they pick it and wait for its
	// turn) rather than each opening one.
	for retried := false; ; {
		hc, opened := l.pickOrOpen(h)
		if !opened {
			// Another call opened one since pick above: share it.
			err := hc.tryOn(ctx, wctx, h, false)
			if !errors.Is(err, errGone) {
				return err
			}
			if wctx.Err() != nil {
				return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, context.Cause(wctx))}
			}
			continue // abandoned, retired or lost meanwhile: pick or open again
		}
		c, err := func() (c *pooltx.Conn, err error) {
			done := false
			defer func() {
				if !done {
					// A panic of the pool's while drawing the connection
					// (a pgx tracer or pgxpool hook): hc, which the calls
					// that come meanwhile share, must not stay "opening"
					// for good; the panic goes on up.
					hc.abandon()
				}
			}()
			if !retried {
				c, err = l.conn(wctx)
			} else {
				c, err = l.livePin(wctx) // a connection it has just pinged
			}
			done = true
			return c, err
		}()
		if err != nil {
			hc.abandon()
			return &LockError{Op: a.op, Keys: a.s.all, Err: classify(ctx, err)}
		}
		perr := func() error {
			done := false
			defer func() {
				if !done { // the check's statement panicked (a pgx tracer's): c goes, the panic on up
					hc.abandon()
					c.MarkDirty(errStatementPanicked)
					l.unpin(c)
				}
			}()
			err := l.checkProxy(ctx, wctx, c, a.op, a.s.all)
			done = true
			return err
		}()
		if err := perr; err != nil {
			// A Locker's first session-scope call checks for a proxy on
			// the connection it drew: one found dead there is retried as
			// below (the check has no answer yet: it runs again).
			died := !retried && diedIdle(ctx, wctx, c, err)
			hc.abandon()
			l.unpin(c)
			if !died {
				return err
			}
			retried = true
			continue
		}
		hc.attach(ctx, c)
		err = hc.tryOn(ctx, wctx, h, true)
		if !errors.Is(err, errGone) {
			return err
		}
		if retried {
			return err.(chain)[1]
		}
		// A pooled connection found dead before anything was locked (see
		// diedIdle): once more on another.
		retried = true
	}
}

// waitHeld takes h's keys by a wait on a connection of its own (as
// WithLock does) and makes that connection a holder connection. Only a
// blocking call (h.a.try false) comes here.
func (l *Locker) waitHeld(ctx, wctx context.Context, h *Lock) error {
	a := h.a
	if err := l.acquireSessionWithin(ctx, wctx, a); err != nil {
		return err
	}
	hc := l.newHolder(ctx, a.c, h)
	a.c = nil // hc's now
	hc.adopt(h)
	hc.give()
	return nil
}
