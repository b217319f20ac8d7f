package advisory

import (
	"context"
	"sync"

	"github.com/pgxlock/pgxlock/keys"
)

// Pool protection. A connection waiting in pg_advisory_lock is as pinned as
// one holding a lock, so N goroutines waiting for one busy key would take N
// connections from the application's pool. Two mechanisms bound that:
//
//   - a local wait queue per key. Its invariant, in one sentence: a call
//     waits in process only behind an earlier call of the same Locker that
//     is on its way to the server for the same key, waits there for it, or
//     holds it exclusively, and never while its own connection holds a lock;
//     so it waits in process only where PostgreSQL would make it wait too
//     (TestLocalQueueWaitsOnlyWherePostgresWould). Of the goroutines of one
//     Locker that wait for a key, only the first in line waits on the
//     server (pinning a connection); the others wait in process, without a
//     connection, in FIFO order, and move up one at a time;
//   - Config.MaxConns, a FIFO cap on the connections the Locker pins at
//     once, holders and waiters together.
//
// Which calls queue, and for what: a blocking call queues for the first of
// its keys (in keys.Compare order, the order the locks are taken) before it
// pins a connection, and leaves the queue as soon as its lock statement is
// over. Its connection holds nothing while it queues. While it is in the
// queue ahead of others, it is either on its way to the server, or waiting
// there for that first key (whoever holds it then holds it in a mode that
// conflicts with the waiter, so PostgreSQL queues later requests too), or,
// for an exclusive multi-key call, holding the first key exclusively while
// it waits for a later one. A shared multi-key call does not queue at all:
// holding its first key in shared mode, it would make later shared callers
// wait locally for a key PostgreSQL would grant them. Queueing for the
// first key only, not for every key, is what lets a call for a later key,
// free on the server, go through at once. (A call behind one still on its
// way to the server may wait while the key is free for a moment: the call
// ahead is first in line for it, on the server as here.)
//
// A wait in process is invisible to PostgreSQL's deadlock detector. That
// costs nothing for the calls above (none of them would be granted by the
// server either), but a cycle that passes through the client (a holder
// asking, on another connection, for a key held by a goroutine that waits
// for the holder's key) is never seen by PostgreSQL whatever the queues do:
// such nested calls end at their timeout, never with 40P01.
//
// Try calls never wait for a lock, so they skip the queues (they still
// count against MaxConns, and wait for a connection at most
// Locker.tryConnWait).

// fifo is a mutex whose waiters are served in arrival order and can give
// up with their context. A buffered channel of one is exactly that: Go
// queues blocked senders in order.
type fifo chan struct{}

func (f fifo) lock(ctx context.Context) error {
	select {
	case f <- struct{}{}:
		return nil
	default:
	}
	select {
	case f <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f fifo) unlock() { <-f }

// gates holds the per-key wait queues of a Locker. An entry lives while a
// call uses it; entries are recycled through a sync.Pool, so an
// uncontended call allocates nothing here.
type gates struct {
	mu sync.Mutex
	m  map[keys.Key]*gate
}

type gate struct {
	q    fifo
	refs int
}

var gatePool = sync.Pool{New: func() any { return &gate{q: make(fifo, 1)} }}

// ticket is a place in the queue of one key, taken by enterInto and given
// back by leave.
type ticket struct {
	g     *gates
	e     *gate
	key   keys.Key
	taken bool // e's queue is locked by this ticket
}

// enterInto queues for k, filling t, a zero ticket kept in the call's
// state. It returns ctx's error, queueing for nothing, if ctx ends first.
// t.leave() must be called once the wait is over.
func (g *gates) enterInto(ctx context.Context, k keys.Key, t *ticket) error {
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[keys.Key]*gate)
	}
	*t = ticket{g: g, e: g.ref(k), key: k}
	g.mu.Unlock()
	if err := t.e.q.lock(ctx); err != nil {
		t.leave()
		return err
	}
	t.taken = true
	return nil
}

// leave unlocks the queue and drops the reference. It is idempotent, and
// safe on a nil ticket (a call that does not queue has none).
func (t *ticket) leave() {
	if t == nil || t.e == nil {
		return
	}
	if t.taken {
		t.e.q.unlock()
		t.taken = false
	}
	e := t.e
	t.e = nil // a second leave does nothing
	g := t.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(g.m, t.key)
		gatePool.Put(e) // its queue is empty: every lock was unlocked
	}
}

// ref returns the gate of k with one more reference; g.mu is held.
func (g *gates) ref(k keys.Key) *gate {
	e := g.m[k]
	if e == nil {
		e = gatePool.Get().(*gate)
		g.m[k] = e
	}
	e.refs++
	return e
}

// connCap is the FIFO semaphore behind Config.MaxConns; nil means no cap.
type connCap chan struct{}

func (c connCap) acquire(ctx context.Context) error {
	if c == nil {
		return nil
	}
	return fifo(c).lock(ctx)
}

func (c connCap) release() {
	if c != nil {
		<-c
	}
}
