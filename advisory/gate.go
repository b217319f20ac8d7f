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
//   - a local wait queue per key: of the goroutines of one Locker that wait
//     for a key, only the first in line waits on the server (pinning a
//     connection); the others wait in process, without a connection, in
//     FIFO order, and move up one at a time. Waiting calls for several keys
//     queue for each of them in the keys' total order, so queues cannot
//     deadlock each other;
//   - Config.MaxConns, a FIFO cap on the connections the Locker pins at
//     once, holders and waiters together.
//
// Try calls never wait, so they skip the key queues (they still count
// against MaxConns).

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

// ticket is a place in the queues of some keys, returned by enter and
// given back by leave. The common single-key case needs no slice.
type ticket struct {
	g     *gates
	one   *gate // the single key's gate, or nil
	many  []*gate
	taken int // gates locked so far, in order
	keys  []keys.Key
}

// enter queues for every key of ks, in order. It returns ctx's error,
// queueing for nothing, if ctx ends first. leave must be called once.
func (g *gates) enter(ctx context.Context, ks []keys.Key) (*ticket, error) {
	t := &ticket{g: g, keys: ks}
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[keys.Key]*gate)
	}
	if len(ks) == 1 {
		t.one = g.ref(ks[0])
	} else {
		t.many = make([]*gate, len(ks))
		for i, k := range ks {
			t.many[i] = g.ref(k)
		}
	}
	g.mu.Unlock()
	for i := 0; i < len(ks); i++ {
		if err := t.gate(i).q.lock(ctx); err != nil {
			t.leave()
			return nil, err
		}
		t.taken++
	}
	return t, nil
}

func (t *ticket) gate(i int) *gate {
	if t.one != nil {
		return t.one
	}
	return t.many[i]
}

// leave unlocks the queues taken, in reverse order, and drops the
// references. It is idempotent, and safe on a nil ticket (a Try call
// queues for nothing).
func (t *ticket) leave() {
	if t == nil {
		return
	}
	for i := t.taken - 1; i >= 0; i-- {
		t.gate(i).q.unlock()
	}
	t.taken = 0
	ks := t.keys
	t.keys = nil // a second leave does nothing
	g := t.g
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range ks {
		e := g.m[k]
		if e.refs--; e.refs == 0 {
			delete(g.m, k)
			gatePool.Put(e) // its queue is empty: every lock was unlocked
		}
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
