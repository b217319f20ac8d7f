package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// ErrProxy: a session-scope call found a connection proxy (PgBouncer or
// similar) between the pool and PostgreSQL. In transaction pooling mode a
// session lock stays on whichever server connection ran the statement, so
// it neither excludes the next caller nor can be unlocked reliably. Use the
// transaction-scope calls (WithXactLock...), which keep working, or set
// Config.AllowProxy for a proxy in session pooling mode.
var ErrProxy = errors.New("advisory: session locks refused through a connection proxy (PgBouncer?)")

// DetectProxy reports whether conn talks to PostgreSQL through a proxy.
// It compares the backend process ID that the server announced when the
// connection was opened with the one a query reports now: PgBouncer
// announces an ID of its own. One round trip.
func DetectProxy(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
		return false, fmt.Errorf("advisory: detect proxy: %w", err)
	}
	return pid != conn.PgConn().PID(), nil
}

// checkProxy runs DetectProxy on the first session-scope call of the
// Locker (and again after a check that failed), unless AllowProxy is set.
// The check, and the wait for another call's check to end, are bounded by
// wctx, the call's whole wait: a check the bound ends (a server or network
// that does not answer), ctx's deadline included, is ErrNoConnection, and
// the next call checks again.
func (l *Locker) checkProxy(ctx, wctx context.Context, c *pooltx.Conn, op string, ks []keys.Key) error {
	if l.cfg.AllowProxy {
		return nil
	}
	state := l.proxyState.Load() // fast path: every call after the first
	if state == proxyUnchecked {
		if err := l.proxyTurn.lock(wctx); err != nil {
			return &LockError{Op: op, Keys: ks, Err: classify(ctx, noConnection(err))}
		}
		if state = l.proxyState.Load(); state == proxyUnchecked {
			proxied, err := DetectProxy(wctx, c.Conn())
			if err != nil {
				l.proxyTurn.unlock()
				if wctx.Err() != nil {
					// The call's bound, ctx's deadline or its cancellation
					// ended it: no lock was waited for.
					err = noConnection(err)
				}
				return &LockError{Op: op, Keys: ks, Err: classify(ctx, err)}
			}
			state = proxyDirect
			if proxied {
				state = proxyFound
				l.log.WarnContext(ctx, "advisory: connection proxy detected; session locks refused", "op", op, "keys", keyStrings(ks))
			}
			l.proxyState.Store(state)
		}
		l.proxyTurn.unlock()
	}
	if state == proxyFound {
		return &LockError{Op: op, Keys: ks, Err: ErrProxy}
	}
	return nil
}

// Values of Locker.proxyState.
const (
	proxyUnchecked int32 = iota
	proxyDirect
	proxyFound
)
