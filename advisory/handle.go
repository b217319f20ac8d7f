package advisory

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgxlock/pgxlock/internal/cutoff"
	"github.com/pgxlock/pgxlock/keys"
)

// Lock is a session-level advisory lock held on one pinned connection
// beyond a single function call: a leader loop, a long migration, a
// command run under a lock. It is returned by [Locker.Lock] and friends.
//
// While the lock is held, nobody uses its connection but a watcher, which
// notices at once when the connection dies (the backend was terminated,
// the server restarted or closed the socket) and, with a bounded ping every
// Config.HeartbeatInterval, a frozen server or a silent network partition.
// The watcher starts watchDelay (1 ms) after the lock is taken, and a lock
// released sooner never starts one; a connection that died in that first
// millisecond is seen as soon as the watcher starts.
// PostgreSQL releases a dead session's locks immediately, so another
// process may already hold the key: the watcher marks the lock lost, closes
// Done, logs, and destroys the connection.
//
// A Lock must be ended with Unlock, also after it was lost. Its methods are
// safe for concurrent use.
type Lock struct {
	l *Locker
	a *acquired

	done chan struct{} // closed on loss or Unlock

	mu        sync.Mutex
	err       error // nil while held; the loss, or errUnlocked
	waiting   bool  // the watcher is parked in a read with a deadline we may cut short
	stopping  bool
	unlockErr error
	unlocked  bool
	unlockEnd chan struct{} // closed once unlockErr is set

	watchCtx   context.Context // the acquisition's values, never cancelled
	watchStart cutoff.Bound    // starts the watcher (see watchDelay)
	watchDone  chan struct{}   // closed when the watcher has returned or will never run
}

// watchDelay is how long a Lock goes unwatched after it is taken: a lock
// released within it never starts a watcher goroutine (nor its read and
// the interruption of that read at Unlock), which would cost more than
// the lock itself.
const watchDelay = time.Millisecond

// ErrUnlocked is what Lock.Err returns after a successful Unlock.
var ErrUnlocked = errors.New("advisory: lock released")

// ErrLockLost: the connection that held a session lock died while the lock
// was supposed to be held, so PostgreSQL released it and another session
// may hold it now. The holder must stop acting as the lock's owner. It is
// the cause (context.Cause) of a Hold callback's context and the error of
// Lock.Err and Lock.Unlock, wrapping what the watcher saw.
var ErrLockLost = errors.New("advisory: lock lost")

// Lock takes key at session level, waiting as WithLock does, and returns a
// handle that holds it until Unlock. ctx governs only the acquisition.
// Errors are those of WithLock.
func (l *Locker) Lock(ctx context.Context, key keys.Key, opts *Options) (*Lock, error) {
	a, ks := oneKey(key)
	return l.lock(ctx, a, ks, opts, false)
}

// TryLock is Lock without waiting; a busy key gives ErrNotAcquired.
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
	if err := l.acquireSession(ctx, a, ks, opts, try); err != nil {
		return nil, err
	}
	h := &Lock{
		l: l, a: a,
		done:      make(chan struct{}),
		watchDone: make(chan struct{}),
		unlockEnd: make(chan struct{}),
		watchCtx:  context.WithoutCancel(ctx),
	}
	// On the timer internal/cutoff shares, not one per lock: arming a
	// runtime timer per Lock woke Go's network poller once per cycle.
	h.watchStart.StartExpiry((*watchStarter)(h), watchDelay)
	return h, nil
}

// watchStarter starts a Lock's watcher once watchDelay has passed.
type watchStarter Lock

func (w *watchStarter) Expire() { go (*Lock)(w).watch() }

// Keys returns the keys the lock holds, sorted and de-duplicated.
func (h *Lock) Keys() []keys.Key { return append([]keys.Key(nil), h.a.s.all...) }

// Done returns a channel that is closed when the lock is lost or unlocked.
func (h *Lock) Done() <-chan struct{} { return h.done }

// Err returns nil while the lock is held; after Done is closed, an error
// matching ErrLockLost (wrapping what killed the connection) if the lock
// was lost, whether the watcher or Unlock found the loss first, or
// ErrUnlocked after an Unlock that found the lock held.
func (h *Lock) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Unlock releases the lock and its connection. It is idempotent: later
// calls, concurrent ones included, return the first call's result once it
// is known. ctx contributes only its values:
// the unlock runs under a fresh context bounded by Config.CleanupTimeout.
// It returns nil, or an error matching ErrLockLost if the lock had been
// lost (the connection was found dead, by the watcher or by this unlock:
// either way Err then returns the same error and the loss is traced once,
// with TraceLost and no TraceRelease), or ErrNotHeld if PostgreSQL did
// not have it any more.
func (h *Lock) Unlock(ctx context.Context) error {
	h.mu.Lock()
	if h.unlocked {
		// A concurrent call may still be unlocking: wait for its result.
		h.mu.Unlock()
		<-h.unlockEnd
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.unlockErr
	}
	h.unlocked = true
	h.stopping = true
	if h.waiting {
		// Cut the watcher's read short; it resets the deadline itself.
		_ = h.a.c.Conn().PgConn().Conn().SetReadDeadline(time.Now())
	}
	h.mu.Unlock()
	if h.watchStart.End() {
		close(h.watchDone) // the watcher never started and never will
	}
	<-h.watchDone

	h.mu.Lock()
	lost := h.err
	h.mu.Unlock()
	var err error
	if lost != nil {
		err = lost // the watcher has destroyed the connection already
	} else {
		// The unlock may be first to find the connection dead (the watcher
		// had not started, or had not read yet): that is the loss, reported
		// here once (TraceLost, Err) instead of by the watcher.
		err = h.l.unlockSession(ctx, h.a.c, &h.a.s, h.a.shared)
		h.a.span.ended(err)
		h.l.unpin(h.a.c)
	}

	h.mu.Lock()
	h.unlockErr = err
	close(h.unlockEnd)
	if h.err == nil {
		h.err = ErrUnlocked
		if errors.Is(err, ErrLockLost) {
			h.err = err
		}
		close(h.done)
	}
	h.mu.Unlock()
	return err
}

// lose records the loss once and closes Done.
func (h *Lock) lose(ctx context.Context, cause error) {
	err := &LockError{Op: h.a.op, Keys: h.a.s.all, Err: join(ErrLockLost, cause)}
	h.a.c.MarkDirty(err)
	h.l.unpin(h.a.c)
	h.a.span.lost(err)
	h.mu.Lock()
	if h.err == nil {
		h.err = err
		close(h.done)
	}
	h.mu.Unlock()
}

// watch runs while the lock is held. It parks in a read on the idle
// connection (WaitForNotification), which returns at once when the server
// ends the session or the socket closes, and costs no traffic. Every
// HeartbeatInterval the read times out and a ping bounded by
// HeartbeatTimeout checks that the server still answers. Unlock stops it by
// cutting the read short; the watcher never reads while anything else uses
// the connection, because nothing else does until it has returned.
func (h *Lock) watch() {
	defer close(h.watchDone)
	ctx := h.watchCtx
	pg := h.a.c.Conn().PgConn()
	nc := pg.Conn()
	interval, timeout := h.l.cfg.HeartbeatInterval, h.l.cfg.HeartbeatTimeout
	for {
		h.mu.Lock()
		if h.stopping {
			h.mu.Unlock()
			return
		}
		h.waiting = true
		var deadline time.Time
		if interval > 0 {
			deadline = time.Now().Add(interval)
		}
		_ = nc.SetReadDeadline(deadline)
		h.mu.Unlock()

		// context.Background: no pgx context watcher (which could send
		// cancel requests); the read deadline above is the only timer.
		err := pg.WaitForNotification(context.Background())

		h.mu.Lock()
		h.waiting = false
		_ = nc.SetReadDeadline(time.Time{})
		stopping := h.stopping
		h.mu.Unlock()

		switch {
		case stopping && (err == nil || isTimeout(err)):
			return
		case err == nil:
			continue // a notification for a channel the caller LISTENed to
		case isTimeout(err) && !pg.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, timeout)
			perr := pg.Ping(pctx)
			cancel()
			if perr != nil {
				h.lose(ctx, perr)
				return
			}
		default:
			h.lose(ctx, err)
			return
		}
	}
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
