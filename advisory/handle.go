package advisory

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgxlock/pgxlock/keys"
)

// Lock is a session-level advisory lock held beyond a single function
// call: a leader loop, a long migration, a command run under a lock. It is
// returned by [Locker.Lock] and friends.
//
// Where it lives (its home) is one of two kinds, each with its rule in its
// own doc comment: a holder connection it shares with other held locks of
// the same Locker (holderConn, the default), or a pooled connection of its
// own (dedicated, with Config.DisableMultiplexing). Either way nobody runs
// anything on that connection but this package, and a watcher notices at
// once when the connection dies (the backend was terminated, the server
// restarted or closed the socket) and, with a bounded ping every
// Config.HeartbeatInterval, a frozen server or a silent network partition.
// The watcher starts watchDelay (1 ms) after the connection begins to hold
// locks, and a lock released sooner never starts one; a connection that
// died in that first millisecond is seen as soon as the watcher starts.
// PostgreSQL releases a dead session's locks immediately, so another
// process may already hold the key: the watcher marks every lock on the
// connection lost, closes their Done, logs, and destroys the connection.
//
// A Lock must be ended with Unlock, also after it was lost. Its methods are
// safe for concurrent use.
type Lock struct {
	l    *Locker
	a    *acquired
	home home // where the lock lives: &ded, or a holderConn

	done chan struct{} // closed on loss or Unlock

	mu        sync.Mutex
	err       error // nil while held; the loss, or errUnlocked
	lostTrace bool  // the loss has been traced (markLost): once per lock
	// pendingLoss is the loss of a lock whose connection is being lost,
	// set before anyone can see it gone (under mu, with l.holders.mu held
	// too on a holder connection) and traced by markLost right after:
	// an Unlock that runs meanwhile returns it, cause included, and leaves
	// closing Done to markLost, after TraceLost.
	pendingLoss error
	marking     bool // pendingLoss is set and markLost has not finished (under mu)
	doneClosed  bool // Done is closed (under mu)
	unlockErr   error
	unlocked    bool
	unlockEnd   chan struct{} // closed once unlockErr is set

	ded dedicated // the home of a dedicated lock (kept here: no allocation)

	// Under l.holders.mu, for a lock on a holder connection: the record
	// (see holderConn) it is part of, its neighbours there, and whether it
	// is still being asked for.
	on         *holderConn
	prev, next *Lock
	pending    bool
}

// home is where a held lock lives: the connection that holds its keys and
// what watches that connection. Its two kinds each state their rule in
// their own doc comment: dedicated (dedicated.go: a connection of the
// lock's own) and holderConn (shared.go: a connection shared with other
// held locks of the Locker).
type home interface {
	// release unlocks h's keys, lets the connection go if nothing else
	// holds it, reports the end of the lock to the tracer once (TraceLost
	// or TraceRelease), and returns what Unlock returns. It is called once.
	release(ctx context.Context, h *Lock) error
}

// watchDelay is how long a held lock's connection goes unwatched after it
// begins to hold: a lock released within it never starts a watcher
// goroutine (nor its read and the interruption of that read at Unlock),
// which would cost more than the lock itself.
const watchDelay = time.Millisecond

// ErrUnlocked is what Lock.Err returns after a successful Unlock.
var ErrUnlocked = errors.New("advisory: lock released")

// ErrLockLost: the connection that held a session lock died while the lock
// was supposed to be held, so PostgreSQL released it and another session
// may hold it now. The holder must stop acting as the lock's owner. It is
// the cause (context.Cause) of a Hold callback's context and the error of
// Lock.Err and Lock.Unlock, wrapping what the watcher saw. A shared holder
// connection that dies loses every lock on it: each one's Err matches
// ErrLockLost and each loss is traced once.
var ErrLockLost = errors.New("advisory: lock lost")

// Lock takes key at session level, waiting as WithLock does, and returns a
// handle that holds it until Unlock. ctx governs only the acquisition.
// Errors are those of WithLock. Unless Config.DisableMultiplexing is set,
// the key is tried first on a holder connection the Locker shares between
// held locks; when it is busy there, or no holder connection can take it,
// the call takes it on a connection of its own (waiting there if it must),
// which, once granted, becomes a holder connection too.
func (l *Locker) Lock(ctx context.Context, key keys.Key, opts *Options) (*Lock, error) {
	a, ks := oneKey(key)
	return l.lock(ctx, a, ks, opts, false)
}

// TryLock is Lock without waiting; a busy key gives ErrNotAcquired. Unless
// Config.DisableMultiplexing is set, it runs on a holder connection that
// already holds other locks of the Locker when one can take the key (see
// the package doc), and on a new one otherwise.
func (l *Locker) TryLock(ctx context.Context, key keys.Key, opts *Options) (*Lock, error) {
	a, ks := oneKey(key)
	return l.lock(ctx, a, ks, opts, true)
}

// LockAll takes several keys, all or nothing, as WithLockAll does.
func (l *Locker) LockAll(ctx context.Context, ks []keys.Key, opts *Options) (*Lock, error) {
	return l.lock(ctx, &acquired{}, ks, opts, false)
}

// TryLockAll is LockAll without waiting: if any key is busy none is held.
func (l *Locker) TryLockAll(ctx context.Context, ks []keys.Key, opts *Options) (*Lock, error) {
	return l.lock(ctx, &acquired{}, ks, opts, true)
}

func (l *Locker) lock(ctx context.Context, a *acquired, ks []keys.Key, opts *Options, try bool) (*Lock, error) {
	if err := a.init(l, sessionOp(try), ks, opts, try); err != nil {
		return nil, err
	}
	h := &Lock{l: l, a: a}
	if l.cfg.DisableMultiplexing {
		if err := l.acquireSession(ctx, a); err != nil {
			return nil, err
		}
		h.done = make(chan struct{})
		h.unlockEnd = make(chan struct{})
		h.ded.start(ctx, h)
		h.home = &h.ded
		return h, nil
	}
	h.done = make(chan struct{})
	h.unlockEnd = make(chan struct{})
	if err := l.acquireHeld(ctx, h); err != nil {
		return nil, err
	}
	return h, nil
}

// Keys returns the keys the lock holds, sorted and de-duplicated.
func (h *Lock) Keys() []keys.Key { return append([]keys.Key(nil), h.a.s.all...) }

// Done returns a channel that is closed when the lock is lost or unlocked.
func (h *Lock) Done() <-chan struct{} { return h.done }

// Err returns nil while the lock is held; after Done is closed, an error
// matching ErrLockLost (wrapping what killed the connection) if the lock
// was lost, whether the watcher or Unlock found the loss first (while the
// loss is being traced it may already return it), or ErrUnlocked after any
// other Unlock: one that found the lock held, or one that returned
// ErrNotHeld.
func (h *Lock) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Unlock releases the lock, and its connection when no other lock is held
// on it. It is idempotent: later calls, concurrent ones included, return
// the first call's result once it is known, or, once the lock's loss is
// being traced, an error matching ErrLockLost at once (a LostTracer may
// unlock the lock it is told of while another Unlock of it waits for the
// trace to end). ctx contributes only its
// values: the unlock runs under a fresh bound, Config.CleanupTimeout (on a
// shared holder connection, also at most Config.HeartbeatTimeout when
// heartbeats are on). It returns nil, or an error matching ErrLockLost if
// the lock had been lost (the connection was found dead, by the watcher or
// by this unlock: either way Err then returns the same error and the loss
// is traced once, with TraceLost and no TraceRelease; when the watcher is
// still marking the locks of a lost holder connection one by one, this
// lock's TraceLost may come just after Unlock returns, and Done closes
// after it), or ErrNotHeld if
// PostgreSQL did not have it any more (on a shared holder connection that
// puts the connection in doubt: it is destroyed and every other lock on it
// is lost).
func (h *Lock) Unlock(ctx context.Context) error {
	h.mu.Lock()
	if h.unlocked {
		if h.lostTrace || h.marking {
			// The loss is being or has been marked or traced: the lock's
			// end is known, and this call may come from a LostTracer that
			// the unlocking call (or the loss it waits for, which may hold
			// the holder connection's turn) is running: waiting would
			// deadlock.
			h.mu.Unlock()
			return h.lostErr()
		}
		// A concurrent call may still be unlocking: wait for its result.
		h.mu.Unlock()
		<-h.unlockEnd
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.unlockErr
	}
	h.unlocked = true
	h.mu.Unlock()
	released := false
	defer func() {
		if !released {
			// The release panicked (a pgx tracer's panic in the unlock):
			// it destroyed the connection, and the lock with it. A
			// concurrent or later Unlock, Done and Err learn so; the
			// panic goes on up.
			h.mu.Lock()
			h.unlockErr = &LockError{Op: opName(kindUnlock, h.a.shared), Keys: h.a.s.all, Err: join(ErrLockLost, errStatementPanicked)}
			close(h.unlockEnd)
			if h.err == nil || h.err == ErrUnlocked {
				h.err = h.unlockErr
			}
			if !h.marking {
				h.closeDone()
			}
			h.mu.Unlock()
		}
	}()
	err := h.home.release(ctx, h)
	released = true

	h.mu.Lock()
	h.unlockErr = err
	close(h.unlockEnd)
	if h.err == nil {
		h.err = ErrUnlocked
		if errors.Is(err, ErrLockLost) {
			h.err = err
		}
	}
	if !h.marking {
		h.closeDone()
	} // else the loss is being marked: markLost closes Done after TraceLost
	h.mu.Unlock()
	return err
}

// lostErr is what Unlock returns for a lock whose holder connection was
// lost: the loss recorded by markLost, or, while the loss is still being
// marked (a LostTracer that unlocks runs before the loss is recorded), an
// error matching ErrLockLost.
func (h *Lock) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil && h.err != ErrUnlocked {
		return h.err
	}
	if h.pendingLoss != nil {
		return h.pendingLoss
	}
	return &LockError{Op: opName(kindUnlock, h.a.shared), Keys: h.a.s.all, Err: ErrLockLost}
}

// closeDone closes Done once; h.mu is held.
func (h *Lock) closeDone() {
	if !h.doneClosed {
		h.doneClosed = true
		close(h.done)
	}
}

// pendingLossErr returns the loss setPendingLoss recorded.
func (h *Lock) pendingLossErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pendingLoss
}

// setPendingLoss records err as the loss being marked (see pendingLoss);
// markLost follows.
func (h *Lock) setPendingLoss(err error) {
	h.mu.Lock()
	h.pendingLoss, h.marking = err, true
	h.mu.Unlock()
}

// markLost records err (matching ErrLockLost) as the lock's loss, traces it
// and closes Done, unless the lock has ended already. It reports whether it
// did.
//
// An Unlock that found the loss being marked (lostErr) may have returned
// first, with the pending loss: the loss is still traced here, once, so
// that a loss is never left untraced (a LostTracer's held gauge would stay
// up for good), and Done closes here, after the trace. The loss is recorded
// (Err) before the trace, so that a LostTracer's Unlock, which returns at
// once, and Err agree.
func (h *Lock) markLost(err error) bool {
	h.mu.Lock()
	if h.lostTrace || (h.err != nil && !errors.Is(h.err, ErrLockLost)) {
		// Traced already (whoever traced closes Done after it), or
		// unlocked before the loss.
		h.marking = false
		if !h.lostTrace {
			h.closeDone()
		}
		h.mu.Unlock()
		return false
	}
	h.lostTrace = true
	if h.err == nil {
		h.err = err // Err, and an Unlock from the LostTracer, see the loss now
	}
	h.mu.Unlock()
	h.a.span.lost(err) // traced before Done closes: a waiter on Done sees it
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marking = false
	if h.doneClosed {
		return false
	}
	h.closeDone()
	return true
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// Hold takes key like Lock and runs fn while holding it, with a context
// that is cancelled, with cause ErrLockLost (see context.Cause), as soon as
// the lock is lost. fn does not get the connection: it stays with the
// watcher. Use it for work done elsewhere (other pools, other services)
// that must stop when the lock goes. Hold unlocks when fn returns and
// returns fn's error, joined with an error matching ErrLockLost if the lock
// was lost meanwhile (once: when fn's error already carries the loss, as
// context.Cause(ctx) does, it is not repeated). A panic in fn releases the
// lock and is re-raised.
func (l *Locker) Hold(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context) error) error {
	return l.hold(ctx, []keys.Key{key}, opts, false, fn)
}

// TryHold is Hold without waiting; a busy key gives ErrNotAcquired.
func (l *Locker) TryHold(ctx context.Context, key keys.Key, opts *Options, fn func(ctx context.Context) error) error {
	return l.hold(ctx, []keys.Key{key}, opts, true, fn)
}

// HoldAll is Hold for several keys, all or nothing.
func (l *Locker) HoldAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context) error) error {
	return l.hold(ctx, ks, opts, false, fn)
}

// TryHoldAll is HoldAll without waiting.
func (l *Locker) TryHoldAll(ctx context.Context, ks []keys.Key, opts *Options, fn func(ctx context.Context) error) error {
	return l.hold(ctx, ks, opts, true, fn)
}

func (l *Locker) hold(ctx context.Context, ks []keys.Key, opts *Options, try bool, fn func(ctx context.Context) error) error {
	if fn == nil {
		return &LockError{Op: opName(sessionOp(try), opts.shared()), Keys: ks, Err: invalid("nil callback")}
	}
	h, err := l.lock(ctx, &acquired{}, ks, opts, try)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	finished := make(chan struct{})
	relayed := make(chan struct{})
	go func() { // relays a loss to fctx; owned: waited for below
		defer close(relayed)
		select {
		case <-h.Done():
			if err := h.Err(); err != nil && !errors.Is(err, ErrUnlocked) {
				cancel(err)
			}
		case <-finished:
		}
	}()
	defer func() {
		close(finished)
		<-relayed
	}()
	panicked := true
	defer func() {
		if panicked {
			_ = h.Unlock(ctx)
		}
	}()
	fnErr := fn(fctx)
	panicked = false
	uerr := h.Unlock(ctx)
	if fnErr != nil && uerr != nil && errors.Is(fnErr, uerr) {
		uerr = nil // fn returned the loss (context.Cause): say it once
	}
	return join(fnErr, uerr)
}
