package cutoff

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// readErr reads once from c and returns the error.
func readErr(c net.Conn) error {
	var b [1]byte
	_, err := c.Read(b[:])
	return err
}

// TestBoundCutsBlockedRead: a read still blocked when its bound passes
// fails with a deadline error (it would block for ever otherwise).
func TestBoundCutsBlockedRead(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var bd Bound
	bd.Start(a, 20*time.Millisecond)
	defer bd.End()
	if err := readErr(a); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
}

// TestShorterBoundAfterLongerOneIsCutOnTime: a bound that ends before every
// bound in progress re-arms the shared timer earlier (else it would wait
// for the hour-long one).
func TestShorterBoundAfterLongerOneIsCutOnTime(t *testing.T) {
	a1, b1 := net.Pipe()
	defer a1.Close()
	defer b1.Close()
	a2, b2 := net.Pipe()
	defer a2.Close()
	defer b2.Close()
	var long, short Bound
	long.Start(a1, time.Hour)
	defer long.End()
	short.Start(a2, 20*time.Millisecond)
	defer short.End()
	if err := readErr(a2); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
}

// TestEndedBoundLeavesConnectionAlone: after End, nothing is cut, and a
// bound that was cut has its deadline cleared (the connection reads again).
func TestEndedBoundLeavesConnectionAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var cut Bound
	cut.Start(a, time.Millisecond)
	if err := readErr(a); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	cut.End()
	cut.End() // idempotent

	var ended Bound
	ended.Start(a, 10*time.Millisecond)
	ended.End()
	// A bound that cuts b proves the shared timer has fired past ended's
	// deadline; a is not cut by it.
	var other Bound
	other.Start(b, 30*time.Millisecond)
	if err := readErr(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read b: %v, want a deadline error", err)
	}
	other.End()
	go func() { _, _ = b.Write([]byte{1}) }()
	if err := readErr(a); err != nil {
		t.Fatalf("read after End: %v", err)
	}
}

// TestTimerNotArmedPerBound: bounds of one length started one after
// another, each ending in time, arm the shared timer once, not per bound.
func TestTimerNotArmedPerBound(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var first Bound
	first.Start(a, time.Hour) // arms the timer (or finds it armed earlier)
	before := Arms()
	for range 100 {
		var bd Bound
		bd.Start(a, time.Hour)
		bd.End()
	}
	first.End()
	if n := Arms() - before; n != 0 {
		t.Fatalf("the timer was armed %d times for 100 bounds", n)
	}
}

type expirer chan struct{}

func (e expirer) Expire() { close(e) }

// TestExpiryCallsExpirerOnceItsTimeHasPassed, and never after End.
func TestExpiryCallsExpirerOnceItsTimeHasPassed(t *testing.T) {
	var ended Bound
	never := make(expirer) // closing it twice would panic; End must stop it
	ended.StartExpiry(never, 10*time.Millisecond)
	ended.End()

	var bd Bound
	e := make(expirer)
	bd.StartExpiry(e, 30*time.Millisecond)
	<-e // the shared timer has fired past ended's deadline too
	bd.End()
	select {
	case <-never:
		t.Fatal("an ended bound's Expirer ran")
	default:
	}
}
