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
// call uses it.
type gates struct {
	mu sync.Mutex
	m  map[keys.Key]*gate
}

type gate struct {
	q    fifo
	refs int
}

// enter queues for every key of ks, in order, and returns a function that
// leaves all the queues; it returns ctx's error, queueing for nothing, if
// ctx ends first.
func (g *gates) enter(ctx context.Context, ks []keys.Key) (leave func(), err error) {
	taken := make([]*gate, 0, len(ks))
	leave = func() {
		for i := len(taken) - 1; i >= 0; i-- {
			taken[i].q.unlock()
		}
		g.release(ks)
	}
	entries := g.acquire(ks)
	for _, e := range entries {
		if err := e.q.lock(ctx); err != nil {
			leave()
			return nil, err
		}
		taken = append(taken, e)
	}
	return leave, nil
}

func (g *gates) acquire(ks []keys.Key) []*gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = make(map[keys.Key]*gate)
	}
	out := make([]*gate, len(ks))
	for i, k := range ks {
		e := g.m[k]
		if e == nil {
			e = &gate{q: make(fifo, 1)}
			g.m[k] = e
		}
		e.refs++
		out[i] = e
	}
	return out
}

func (g *gates) release(ks []keys.Key) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range ks {
		e := g.m[k]
		if e.refs--; e.refs == 0 {
			delete(g.m, k)
		}
	}
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
