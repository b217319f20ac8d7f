package pooltx

import "context"

// Rollback ends whatever transaction is open on c (one left aborted by a
// failed pipeline, say) and resets the session ([Conn.Reset]), in one round
// trip under a fresh context that keeps ctx's values but not its
// cancellation, bounded by c's cleanup timeout. On success c counts as
// clean. A failure marks c dirty, so that Release destroys it, and returns a
// *CleanupError with Step "rollback"; a connection pgx has already closed is
// marked dirty and nil is returned (its session, and its transaction, are
// over). It is for callers that send their own transaction (BEGIN ...
// COMMIT in one pipeline) rather than use [Conn.Tx].
func (c *Conn) Rollback(ctx context.Context) error {
	c.clean = false
	lent := c.lent
	c.lent = true // the reset runs, lent or not
	err := c.rollback(ctx)
	c.lent = lent
	return err
}
