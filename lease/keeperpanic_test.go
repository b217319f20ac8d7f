package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Do's doc: a panic of the pool's code in a renewal (here its OnNotice
// handler, under client_min_messages = debug5) runs on the keeper's
// goroutine, where it ended the process (found after review 28b). It
// cancels fn's context with a cause matching ErrLeaseLost, and is raised
// again in the caller's goroutine once fn has returned and the lease is
// released.
func TestAPanicInARenewalReachesTheCaller(t *testing.T) {
	ctx := testCtx(t)
	var armed atomic.Bool
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug5" // a notice in every answer
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) {
		if armed.CompareAndSwap(true, false) {
			panic("notice handler")
		}
	}
	pool := pgtest.NewPool(t, cfg)
	m := newManager(t, pool, pgtest.Schema(t, pool), lease.ManagerConfig{TTL: 30 * time.Second})
	var cause error
	require.PanicsWithValue(t, "notice handler", func() {
		_ = m.Do(ctx, "r", &lease.DoOptions{RenewEvery: 50 * time.Millisecond}, func(fctx context.Context, _ *lease.Lease) error {
			armed.Store(true) // the next notice is a renewal's
			<-fctx.Done()
			cause = context.Cause(fctx)
			return nil
		})
	})
	require.ErrorIs(t, cause, lease.ErrLeaseLost)
	assert.ErrorContains(t, cause, "notice handler")
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err, "the lease was released before the panic went on up")
	require.NoError(t, l.Release(ctx))
}
