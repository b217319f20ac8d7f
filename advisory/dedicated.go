package advisory

import (
	"context"
	"errors"
	"time"

	"github.com/pgxlock/pgxlock/internal/cutoff"
)

// dedicated is the home of a held lock on a pooled connection of its own
// (Config.DisableMultiplexing). Its rule: from the grant to Unlock nobody
// uses the connection but the lock's own watcher, and the connection holds
// only this lock's keys, so its loss is this lock's loss alone, and Unlock
// releases the keys and the connection together.
type dedicated struct {
	// Under the Lock's mu:
	waiting  bool // the watcher is parked in a read with a deadline we may cut short
	stopping bool
	lost     bool // the watcher has destroyed the connection and is marking the loss

	watchCtx   context.Context // the acquisition's values, never cancelled
	watchStart cutoff.Bound    // starts the watcher (see watchDelay)
	watchDone  chan struct{}   // closed when the watcher has returned or will never run
}

// start arms the watcher of h, whose keys a.c holds.
func (d *dedicated) start(ctx context.Context, h *Lock) {
	d.watchDone = make(chan struct{})
	d.watchCtx = context.WithoutCancel(ctx)
	// On the timer internal/cutoff shares, not one per lock: arming a
	// runtime timer per Lock woke Go's network poller once per cycle.
	d.watchStart.StartExpiry((*dedicatedStarter)(h), watchDelay)
}

// dedicatedStarter starts the watcher of a dedicated Lock once watchDelay
// has passed.
type dedicatedStarter Lock

func (w *dedicatedStarter) Expire() {
	h := (*Lock)(w)
	go h.ded.watch(h)
}

func (d *dedicated) release(ctx context.Context, h *Lock) error {
	h.mu.Lock()
	if d.lost {
		// The watcher is marking the loss, and may be running this Unlock
		// from a LostTracer: waiting for it would wait for ourselves.
		h.mu.Unlock()
		return h.lostErr()
	}
	d.stopping = true
	if d.waiting {
		// Cut the watcher's read short; it resets the deadline itself.
		_ = h.a.c.Conn().PgConn().Conn().SetReadDeadline(time.Now())
	}
	h.mu.Unlock()
	if d.watchStart.End() {
		close(d.watchDone) // the watcher never started and never will
	}
	<-d.watchDone

	if lost := h.Err(); lost != nil {
		return lost // the watcher has destroyed the connection already
	}
	// The unlock may be first to find the connection dead (the watcher had
	// not started, or had not read yet): that is the loss, reported here
	// once (TraceLost, Err) instead of by the watcher.
	done := false
	defer func() {
		if !done {
			// The unlock panicked (a pgx tracer's): the connection goes,
			// and the lock with it, traced once as lost (Lock.Unlock
			// records it); the panic goes on up.
			h.a.c.MarkDirty(errStatementPanicked)
			h.l.unpin(h.a.c)
			h.a.span.lost(&LockError{Op: opName(kindUnlock, h.a.shared), Keys: h.a.s.all, Err: join(ErrLockLost, errStatementPanicked)})
		}
	}()
	err := h.l.unlockSession(ctx, h.a.c, &h.a.request)
	done = true
	if errors.Is(err, ErrLockLost) {
		// Traced by ended, below: a concurrent Unlock (a LostTracer's)
		// returns this loss at once, and Err agrees, before the trace.
		h.mu.Lock()
		h.lostTrace = true
		if h.err == nil {
			h.err = err
		}
		h.mu.Unlock()
	}
	h.a.span.ended(err)
	h.l.unpin(h.a.c)
	return err
}

// lose records the loss once, destroys the connection and closes Done.
func (d *dedicated) lose(h *Lock, cause error) {
	err := &LockError{Op: h.a.op, Keys: h.a.s.all, Err: join(ErrLockLost, cause)}
	h.a.c.MarkDirty(err)
	h.l.unpin(h.a.c)
	h.mu.Lock()
	d.lost = true
	h.pendingLoss, h.marking = err, true // an Unlock that finds d.lost returns it (see Lock.pendingLoss)
	h.mu.Unlock()
	h.markLost(err)
}

// watch runs while the lock is held. It parks in a read on the idle
// connection (WaitForNotification), which returns at once when the server
// ends the session or the socket closes, and costs no traffic. Every
// HeartbeatInterval the read times out and a ping bounded by
// HeartbeatTimeout checks that the server still answers. Unlock stops it by
// cutting the read short; the watcher never reads while anything else uses
// the connection, because nothing else does until it has returned.
func (d *dedicated) watch(h *Lock) {
	defer close(d.watchDone)
	ctx := d.watchCtx
	pg := h.a.c.Conn().PgConn()
	nc := pg.Conn()
	interval, timeout := h.l.cfg.HeartbeatInterval, h.l.cfg.HeartbeatTimeout
	for {
		h.mu.Lock()
		if d.stopping {
			h.mu.Unlock()
			return
		}
		d.waiting = true
		var deadline time.Time
		if interval > 0 {
			deadline = time.Now().Add(interval)
		}
		_ = nc.SetReadDeadline(deadline)
		h.mu.Unlock()

		err := waitNotification(pg) // the read deadline above is its only timer

		h.mu.Lock()
		d.waiting = false
		_ = nc.SetReadDeadline(time.Time{})
		stopping := d.stopping
		h.mu.Unlock()

		switch {
		case stopping && (err == nil || isTimeout(err)):
			return
		case err == nil:
			continue // a notification for a channel the caller LISTENed to
		case isTimeout(err) && !pg.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, timeout)
			perr := pingGuarded(pctx, pg)
			cancel()
			if perr != nil {
				d.lose(h, perr)
				return
			}
		default:
			d.lose(h, err)
			return
		}
	}
}
