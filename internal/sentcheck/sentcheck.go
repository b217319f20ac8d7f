// Package sentcheck corrects one misreport of pgx v5 (seen in v5.12.0): in the Exec and
// simple protocol modes, and for every statement sent without arguments, pgconn reads
// the answers through a MultiResultReader, whose NextResult drops the error of a read
// that fails after the statements were sent (a connection reset, an EOF) and then
// reports "conn closed", an error that pgconn.SafeToRetry calls safe to retry, as if
// nothing had been sent. The server may have run, and committed, all of it. Code that
// retries, or gives up on a give-back, when nothing was sent asks here instead.
package sentcheck

import (
	"github.com/jackc/pgx/v5/pgconn"
)

// Check returns err, wrapped so that pgconn.SafeToRetry reports false, when pgconn calls
// it safe to retry although pg was open before the call (open) and is closed after it:
// then something may have been sent. Any other err, nil included, is returned as it is.
// The wrapped error's text says that the connection closed after the send; errors.Is and
// errors.As see through it.
func Check(err error, open bool, pg *pgconn.PgConn) error {
	if err == nil || !open || !pg.IsClosed() || !pgconn.SafeToRetry(err) {
		return err
	}
	return &MaybeSentError{Err: err}
}

// MaybeSentError is an error pgconn called safe to retry on a connection that closed
// during the call (see Check): what was sent may have run.
type MaybeSentError struct {
	Err error // pgconn's error
}

func (e *MaybeSentError) Error() string {
	return "the connection closed after the statements were sent: " + e.Err.Error()
}

// Unwrap returns pgconn's error.
func (e *MaybeSentError) Unwrap() error { return e.Err }

// SafeToRetry reports false: the statements may have run.
func (e *MaybeSentError) SafeToRetry() bool { return false }
