package advisory

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlock/pgxlock/pooltx"
)

// ErrStandby: the call's connection reached a hot standby, which
// PostgreSQL 14 and later report to the client (in_hot_standby). A standby
// grants advisory locks, but they are its own: they exclude the standby's
// other sessions, not the primary's and not another standby's, so a lock
// taken there keeps out nobody who locks elsewhere. Nothing was locked. A
// pooled connection is destroyed, so that the pool's next one may reach the
// primary (see "Failover" in the package doc: target_session_attrs); the
// connection of a caller's transaction (LockInTx) is left to the caller.
// Config.AllowStandby lifts the refusal.
var ErrStandby = errors.New("advisory: refused on a hot standby (its advisory locks exclude only its own sessions)")

// errStandbyConn marks a pooled connection destroyed because its server is
// a standby.
var errStandbyConn = errors.New("advisory: connection to a hot standby")

// onStandby reports whether pg's server last said it is a hot standby.
// Before PostgreSQL 14 the server does not say, and it reports false.
func onStandby(pg *pgconn.PgConn) bool { return pg.ParameterStatus("in_hot_standby") == "on" }

// refuseStandby returns ErrStandby when c's server is a hot standby, unless
// Config.AllowStandby. A promotion does not tell an idle session: its
// server reports in_hot_standby off at the end of its next statement. So a
// connection that says "on" is first asked again, with a ping bounded by
// wctx and c's clean-up timeout; a standby still, or one that does not
// answer, is marked dirty (the caller's unpin destroys it).
func (l *Locker) refuseStandby(wctx context.Context, c *pooltx.Conn) error {
	pg := c.Conn().PgConn()
	if l.cfg.AllowStandby || !onStandby(pg) {
		return nil
	}
	pctx, cancel := context.WithTimeout(wctx, c.CleanupTimeout())
	err := pg.Ping(pctx)
	cancel()
	if err == nil && !onStandby(pg) {
		return nil // promoted since it last said
	}
	c.MarkDirty(errStandbyConn)
	if err != nil {
		return noConnection(err)
	}
	return ErrStandby
}
