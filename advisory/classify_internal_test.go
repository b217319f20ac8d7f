package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// lateTimerCtx is a context whose deadline has passed but whose timer has
// not run yet: what a loaded machine shows for a moment after the deadline.
type lateTimerCtx struct {
	context.Context
	deadline time.Time
}

func (c lateTimerCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// TestLockTimeoutAtThePassedDeadlineCarriesDeadlineExceeded: the server's
// lock_timeout set from the deadline fires after it, but ctx.Err() can
// still be nil when the lock statement returns (seen over TLS under load).
// The error still says the deadline caused it.
func TestLockTimeoutAtThePassedDeadlineCarriesDeadlineExceeded(t *testing.T) {
	ctx := lateTimerCtx{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond)}
	err := classify(ctx, &pgconn.PgError{Code: codeLockNotAvailable})
	if !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("got %v, want ErrLockTimeout", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded in the chain", err)
	}

	// A deadline still ahead: the timeout was the call's own, not the deadline's.
	ctx.deadline = time.Now().Add(time.Hour)
	err = classify(ctx, &pgconn.PgError{Code: codeLockNotAvailable})
	if !errors.Is(err, ErrLockTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrLockTimeout without context.DeadlineExceeded", err)
	}
}
