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
//     waits in process only behind two earlier calls of the same Locker
//     that are each on their way to the server for the same key, waiting
//     there for it, or holding it exclusively, and never while its own
//     connection holds a lock; so it waits in process only where PostgreSQL
//     would make it wait too (TestLocalQueueWaitsOnlyWherePostgresWould),
//     and the Locker's next waiter already has its place in PostgreSQL's
//     queue when the one ahead of it is granted
//     (TestLocalQueueKeepsTheLockersPlaceInPostgresQueue). Of the
//     goroutines of one Locker that wait for a key, the first two in line
//     wait on the server (pinning a connection each); the others wait in
//     process, without a connection, in FIFO order, and move up one at a
//     time;
//   - Config.MaxConns, a FIFO cap on the connections the Locker pins at
//     once, holders and waiters together.
//
// Why two and not one (issue 19): PostgreSQL's lock queue is FIFO, but it
// can only order the requests that have reached it. With one waiter per key
// on the server, the Locker's next waiter was sent only once the one ahead
// had been granted and its client had read the grant, so for every turn
// the Locker had no request in PostgreSQL's queue from that grant until the
// next request arrived; every other session whose request got there in
// between was served first. On a loaded machine (several processes and
// their backends on two cores) the request of a process whose goroutine,
// backend or new connection was not scheduled at once arrived late turn
// after turn, while a running process handed the key to its own next
// waiter: one process took hundreds of turns in a row and others got
// almost nothing. With a second waiter already queued, the hand-off to the
// Locker's next waiter happens on the server, in its FIFO place, whether or
// not the process runs; only the third waiter's trip to the server remains,
// and it has a whole turn of the queue to make it. Two still keeps what the
// queue is for: with 64 waiters on a key, 8 of a pool of 10 stay free for
// the application (TestLocalQueuePinsTwoConnectionsAndKeepsFIFO).
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

// fifo is a counting semaphore of cap(f) slots whose waiters are served in
// arrival order and can give up with their context. A buffered channel is
// exactly that: Go queues blocked senders in order, and a receive hands the
// freed slot to the first of them (a new sender cannot barge in, since
// senders block only while the buffer is full).
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

// serverWaiters is how many calls of one Locker may be on their way to the
// server for one key, or waiting there, at once (see above for why two).
const serverWaiters = 2

var gatePool = sync.Pool{New: func() any { return &gate{q: make(fifo, serverWaiters)} }}

// ticket is a place in the queue of one key, taken by enterInto and given
// back by leave.
type ticket struct {
	g     *gates
	e     *gate
	key   keys.Key
	taken bool // this ticket holds one of the slots of e's queue
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

// leave gives back the ticket's slot (the next waiter in line takes it) and
// drops the reference, both under g.mu, so that localWaiters sees either
// both or neither. It is idempotent, and safe on a nil ticket (a call that
// does not queue has none).
func (t *ticket) leave() {
	if t == nil || t.e == nil {
		return
	}
	e := t.e
	t.e = nil // a second leave does nothing
	g := t.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.taken {
		e.q.unlock() // never blocks: the slot is this ticket's
		t.taken = false
	}
	if e.refs--; e.refs == 0 {
		delete(g.m, t.key)
		gatePool.Put(e) // its queue is empty: every lock was unlocked
	}
}

// localWaiters returns how many calls wait in process for k: queued while
// every slot of k is taken. (A call counted in refs while a slot is free is
// about to take it, and is on its way to the server, not waiting here.)
func (g *gates) localWaiters(k keys.Key) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.m[k]
	if e == nil || len(e.q) < cap(e.q) {
		return 0
	}
	return e.refs - len(e.q)
}

// refs returns how many calls of the Locker are in k's queue: waiting in
// process, on their way to the server, or waiting there.
func (g *gates) refs(k keys.Key) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[k]; e != nil {
		return e.refs
	}
	return 0
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
