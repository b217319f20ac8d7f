package lease

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Every error this package returns is an *Error wrapping one or
// more of these (or a driver error), so test with errors.Is, never with ==.
var (
	// ErrNotAcquired means the lease is held by someone else. TryAcquire and
	// TryDo return it at once; Acquire and Do return it joined with the
	// context's error when the context ends while waiting.
	ErrNotAcquired = errors.New("lease: not acquired")

	// ErrLeaseLost means the caller no longer holds the lease it names: it
	// expired, was taken over by a later acquirer, was swept, released, or its
	// row was changed by someone else. Renew and Release return it; Do cancels
	// its callback's context with it as the cause. A stale fencing token in a
	// protected write (Fence.Update) also reports it.
	ErrLeaseLost = errors.New("lease: lost")

	// ErrNotFound means the row a column lease (or a fenced write) names does
	// not exist. It is distinct from ErrNotAcquired so that a typo in an id is
	// not mistaken for contention.
	ErrNotFound = errors.New("lease: row not found")

	// ErrInvalid means bad input, found before any SQL is sent: an empty or
	// oversized resource, a TTL <= 0, a renew interval that does not fit
	// inside the TTL, an invalid identifier, an unknown mode, metadata that is
	// not JSON.
	ErrInvalid = errors.New("lease: invalid argument")
)

// Error is the typed error returned by every operation. It names the operation
// and the resource (for a column lease, the row id printed with %v) and wraps
// the cause: one of the sentinels above, a context error, a *pgconn.PgError,
// or several of them joined. Use errors.Is / errors.As on it.
type Error struct {
	Op       string // "acquire", "try acquire", "renew", "release", ...
	Resource string // resource name or row id; empty for table-wide operations
	Err      error
}

// Error renders "lease: <op> \"<resource>\": <cause>" (without the resource for
// table-wide operations).
func (e *Error) Error() string {
	// The sentinels already carry the "lease: " prefix; do not print it twice.
	msg := "<nil>"
	if e.Err != nil {
		msg = strings.ReplaceAll(e.Err.Error(), "lease: ", "")
	}
	if e.Resource == "" {
		return "lease: " + e.Op + ": " + msg
	}
	return fmt.Sprintf("lease: %s %q: %s", e.Op, e.Resource, msg)
}

// Unwrap returns the wrapped cause.
func (e *Error) Unwrap() error { return e.Err }

func opError(op, resource string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Resource: resource, Err: err}
}

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1. Longer names are silently
// truncated by the server, which could make two configured names collide, so
// they are rejected instead.
const maxIdentifierLen = 63

// MaxResourceLen is the longest resource name accepted, in bytes. It keeps
// index entries far below the btree limit.
const MaxResourceLen = 1024

func checkIdentifier(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	case len(name) > maxIdentifierLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, what, maxIdentifierLen)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

// checkText validates a value stored in a text column: PostgreSQL rejects NUL
// bytes and invalid UTF-8 in text, and an error from the server would be a
// less helpful way to find out.
func checkText(what, s string, maxLen int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	case len(s) > maxLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, what, maxLen)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

// outcomeUnknown reports whether a statement that failed with err may
// nevertheless have committed: the request left the client, and no error
// came back from the server. An error from the server means the (implicit)
// transaction rolled back; pgconn.SafeToRetry means nothing was sent.
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}
