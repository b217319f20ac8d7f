// Package cutoff bounds blocking I/O on connections without a runtime timer
// per bound.
//
// The obvious bound, a deadline on the socket (net.Conn.SetDeadline) set
// before a statement and cleared after it, arms and disarms one of the Go
// runtime's timers each time. Arming a timer earlier than the one the
// network poller sleeps until wakes the poller (the runtime writes to its
// eventfd, and a thread that slept in epoll wakes, runs and sleeps again):
// on a machine of 2 vCPUs that is a thread woken per lock cycle, measured
// at 0.5-0.9 eventfd writes per cycle against 0.03 for raw pgx (see
// BENCHMARKS.md, "Issue 19: where the time goes"). Here one timer, shared
// by every bound of the process, fires at the earliest deadline of the
// bounds in progress, and is re-armed only when it fires or when a bound
// ends earlier than every one in progress: under a steady stream of
// bounds of one length it is armed about once per length.
//
// A bound that is still in progress at its deadline has its connection's
// deadline cut to the present, so that a blocked read or write fails at
// once with a timeout, as a deadline set in advance would have made it fail;
// a bound started with StartExpiry has its Expirer called instead (a
// context that must end at a deadline, without a timer of its own).
package cutoff

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Bound is one bound on one connection. The zero value is ready to use;
// it must not be copied or moved once started, and is started and ended
// by one goroutine at a time.
type Bound struct {
	nc         net.Conn // Start: the connection to cut
	ex         Expirer  // StartExpiry: what to call
	deadline   time.Time
	prev, next *Bound
	on         bool // linked into the list (under mu)
	cut        bool // the deadline of nc was cut (under mu)
}

var (
	mu    sync.Mutex
	head  *Bound      // the bounds in progress (under mu)
	timer *time.Timer // the shared timer (under mu), created on first use
	armed bool        // timer is pending (under mu)
	at    time.Time   // when the pending timer fires (under mu)

	arms atomic.Int64 // how often the timer was armed (tests)
)

// Start bounds the I/O on nc from now until End: once d has passed, a
// read or write still blocked on nc fails with a timeout. It sets no
// deadline on nc.
func (b *Bound) Start(nc net.Conn, d time.Duration) { b.start(nc, nil, d) }

// Expirer is what StartExpiry calls once its time has passed.
type Expirer interface{ Expire() }

// StartExpiry arranges for e.Expire to be called once d has passed, on
// the shared timer's goroutine, unless End is called first. Expire runs
// after the shared state is released (it may start or end bounds), and
// must be safe to call just after End: the time may pass while End waits.
func (b *Bound) StartExpiry(e Expirer, d time.Duration) { b.start(nil, e, d) }

func (b *Bound) start(nc net.Conn, e Expirer, d time.Duration) {
	now := time.Now()
	mu.Lock()
	if b.on {
		unlink(b)
	}
	b.nc, b.ex, b.deadline, b.cut, b.on = nc, e, now.Add(d), false, true
	b.prev, b.next = nil, head
	if head != nil {
		head.prev = b
	}
	head = b
	if !armed || b.deadline.Before(at) {
		arm(b.deadline, now)
	}
	mu.Unlock()
}

// End ends the bound; it is idempotent. It reports whether the bound was
// in progress and its time had not passed: for StartExpiry, that the
// Expirer will not be called (false: it has been or is about to be). If
// the deadline of a Start bound had passed, nc's deadline, which was cut,
// is cleared again (the I/O it cut failed; pgx does not close a connection
// whose read timed out, so a caller whose cut I/O may leave an answer on
// the way must close it or treat it as dirty, never use it again; one
// whose I/O had finished just before is usable).
func (b *Bound) End() (inTime bool) {
	mu.Lock()
	if b.on {
		inTime = !b.cut
		unlink(b)
		if b.cut && b.nc != nil {
			_ = b.nc.SetDeadline(time.Time{})
		}
		b.cut = false
	}
	b.nc, b.ex = nil, nil
	mu.Unlock()
	return inTime
}

// unlink takes b out of the list; mu is held.
func unlink(b *Bound) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
	b.prev, b.next, b.on = nil, nil, false
}

// arm sets the shared timer to fire at t; mu is held.
func arm(t, now time.Time) {
	arms.Add(1)
	armed, at = true, t
	if timer == nil {
		timer = time.AfterFunc(t.Sub(now), fire)
		return
	}
	timer.Reset(t.Sub(now))
}

// fire cuts the bounds whose deadline has passed (or calls their
// Expirer, once the shared state is released) and re-arms the timer for
// the earliest of the others, if any.
func fire() {
	var due []Expirer
	mu.Lock()
	armed = false
	now := time.Now()
	var next time.Time
	for b := head; b != nil; b = b.next {
		switch {
		case b.cut:
		case !b.deadline.After(now):
			b.cut = true
			if b.nc != nil {
				_ = b.nc.SetDeadline(now) // in the past: wakes blocked I/O, arms no timer
			} else {
				due = append(due, b.ex)
			}
		case next.IsZero() || b.deadline.Before(next):
			next = b.deadline
		}
	}
	if !next.IsZero() {
		arm(next, now)
	}
	mu.Unlock()
	for _, e := range due {
		e.Expire()
	}
}

// Arms returns how many times the shared timer has been armed since the
// process started, for tests that check it is not armed per bound.
func Arms() int64 { return arms.Load() }
