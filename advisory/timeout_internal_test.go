package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestBoundMillisIsCutToPostgresMaximum: lock_timeout takes at most
// 2147483647 ms (22023 beyond); a longer bound is cut to it, never to 0
// (which would mean no timeout).
func TestBoundMillisIsCutToPostgresMaximum(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0:                              1,
		time.Microsecond:               1,
		time.Millisecond + 1:           2,
		(1<<31 - 2) * time.Millisecond: 1<<31 - 2,
		(1<<31 - 1) * time.Millisecond: 1<<31 - 1,
		(1<<31-1)*time.Millisecond + 1: 1<<31 - 1,
		600 * time.Hour:                1<<31 - 1,
		time.Duration(1<<63 - 1):       1<<31 - 1,
	} {
		if got := boundMillis(d); got != want {
			t.Errorf("boundMillis(%v) = %d, want %d", d, got, want)
		}
	}
	if got := formatTimeout(600 * time.Hour); got != "2147483647ms" {
		t.Errorf("formatTimeout(600h) = %q", got)
	}
}

// TestClassifyQueryCanceled: 57014 from statement_timeout is a lock
// timeout; 57014 from a cancel request is the context's error when ctx was
// cancelled, and no sentinel otherwise. The PgError stays in the chain.
func TestClassifyQueryCanceled(t *testing.T) {
	stmt := &pgconn.PgError{Code: codeQueryCanceled, Message: "canceling statement due to statement timeout"}
	user := &pgconn.PgError{Code: codeQueryCanceled, Message: "canceling statement due to user request"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	err := classify(context.Background(), stmt)
	if !errors.Is(err, ErrLockTimeout) || !errors.Is(err, stmt) {
		t.Errorf("statement timeout: %v", err)
	}
	err = classify(context.Background(), user)
	if errors.Is(err, ErrLockTimeout) || errors.Is(err, context.Canceled) || !errors.Is(err, user) {
		t.Errorf("another session's cancel: %v", err)
	}
	err = classify(cancelled, user)
	if errors.Is(err, ErrLockTimeout) || !errors.Is(err, context.Canceled) || !errors.Is(err, user) {
		t.Errorf("our cancel: %v", err)
	}
	if OutcomeOf(err) != OutcomeCancelled {
		t.Errorf("our cancel: outcome %v", OutcomeOf(err))
	}

	// lc_messages in another language (German here, as PostgreSQL 15's
	// de.po has them): only the context tells the two apart.
	stmtDE := &pgconn.PgError{Code: codeQueryCanceled, Message: "storniere Anfrage wegen Zeitüberschreitung der Anfrage"}
	userDE := &pgconn.PgError{Code: codeQueryCanceled, Message: "storniere Anfrage wegen Benutzeranforderung"}
	err = classify(context.Background(), stmtDE)
	if !errors.Is(err, ErrLockTimeout) || !errors.Is(err, stmtDE) {
		t.Errorf("statement timeout in German: %v", err)
	}
	err = classify(cancelled, userDE)
	if errors.Is(err, ErrLockTimeout) || !errors.Is(err, context.Canceled) || !errors.Is(err, userDE) {
		t.Errorf("our cancel in German: %v", err)
	}
}
