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

// checkProxy runs DetectProxy on the session-scope calls of the Locker
// until one has answered (again after a check that failed), unless
// AllowProxy is set. Calls that find the state unknown check at once, each
// on its own connection, rather than wait for another's check: one that
// never answers (a half-open connection, a call without a bound) then
// holds no other call. The check is bounded by wctx, the call's whole
// wait: one that the bound or ctx ends is ErrNoConnection.
func (l *Locker) checkProxy(ctx, wctx context.Context, c *pooltx.Conn, op string, ks []keys.Key) error {
	if l.cfg.AllowProxy {
		return nil
	}
	state := l.proxyState.Load() // fast path: every call once one check has answered
	if state == proxyUnchecked {
		proxied, err := DetectProxy(wctx, c.Conn())
		if err != nil {
			if wctx.Err() != nil {
				// The call's bound, ctx's deadline or its cancellation
				// ended it: no lock was waited for.
				err = noConnection(err)
			} else {
				markCheckClean(c)
			}
			return &LockError{Op: op, Keys: ks, Err: classify(ctx, err)}
		}
		state = proxyDirect
		if proxied {
			state = proxyFound
		}
		if l.proxyState.CompareAndSwap(proxyUnchecked, state) && proxied {
			l.log.WarnContext(ctx, "advisory: connection proxy detected; session locks refused", "op", op, "keys", keyStrings(ks))
		}
	}
	if state == proxyFound {
		markCheckClean(c)
		return &LockError{Op: op, Keys: ks, Err: ErrProxy}
	}
	return nil
}

// markCheckClean marks c clean after a proxy check that failed or found a
// proxy, with no context ended (so no cancel request in flight): the check
// ran nothing but SELECT pg_backend_pid(), or pgx refused to send it, and
// the connection goes back as the pool gave it out, with no reset (one
// before the connection's first Lend could not restore what AfterConnect
// set: pooltx has recorded nothing yet). A closed connection is destroyed
// all the same.
func markCheckClean(c *pooltx.Conn) {
	if !c.Lent() && !c.Conn().IsClosed() {
		c.MarkClean()
	}
}

// Values of Locker.proxyState.
const (
	proxyUnchecked int32 = iota
	proxyDirect
	proxyFound
)
