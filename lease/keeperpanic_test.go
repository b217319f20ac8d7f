package lease_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	trap := pgtest.NewTrap("notice handler")
	cfg := pgtest.NoisyConfig(t, trap.Spring) // a notice in every answer
	pool := pgtest.NewPool(t, cfg)
	m := newManager(t, pool, pgtest.Schema(t, pool), lease.ManagerConfig{TTL: 30 * time.Second})
	var cause error
	require.PanicsWithValue(t, "notice handler", func() {
		_ = m.Do(ctx, "r", &lease.DoOptions{RenewEvery: 50 * time.Millisecond}, func(fctx context.Context, _ *lease.Lease) error {
			trap.Arm() // the next notice is a renewal's
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

// goexitTracer is a pool BatchTracer that, once armed, ends the goroutine
// of the next batch it sees with runtime.Goexit (t.FailNow in a test's
// tracer does that).
type goexitTracer struct{ armed atomic.Bool }

func (g *goexitTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if g.armed.CompareAndSwap(true, false) {
		runtime.Goexit()
	}
	return ctx
}
func (*goexitTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*goexitTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (*goexitTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*goexitTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Do's doc: a renewal whose goroutine the pool's code ended with
// runtime.Goexit stops the renewals and cancels fn's context; Do reports
// the lease lost, raises no panic (review 29e: it raised a nil panic), and
// releases it.
func TestAGoexitInARenewalIsALoss(t *testing.T) {
	ctx := testCtx(t)
	tr := &goexitTracer{}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Tracer = tr
	pool := pgtest.NewPool(t, cfg)
	m := newManager(t, pool, pgtest.Schema(t, pool), lease.ManagerConfig{TTL: 30 * time.Second})
	var cause error
	err := m.Do(ctx, "r", &lease.DoOptions{RenewEvery: 50 * time.Millisecond}, func(fctx context.Context, _ *lease.Lease) error {
		tr.armed.Store(true) // the next batch is a renewal's
		<-fctx.Done()
		cause = context.Cause(fctx)
		return nil
	})
	require.ErrorIs(t, err, lease.ErrLeaseLost)
	require.ErrorIs(t, cause, lease.ErrLeaseLost)
	l, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err, "the lease was released")
	require.NoError(t, l.Release(ctx))
}

// Do's doc: a renewal's panic whose value is an error is in the chain of
// fn's context's cause.
func TestARenewalsPanicErrorIsInTheCause(t *testing.T) {
	ctx := testCtx(t)
	boom := errors.New("boom")
	trap := pgtest.NewTrap(boom)
	cfg := pgtest.NoisyConfig(t, trap.Spring) // a notice in every answer
	pool := pgtest.NewPool(t, cfg)
	m := newManager(t, pool, pgtest.Schema(t, pool), lease.ManagerConfig{TTL: 30 * time.Second})
	var cause error
	require.PanicsWithValue(t, boom, func() {
		_ = m.Do(ctx, "r", &lease.DoOptions{RenewEvery: 50 * time.Millisecond}, func(fctx context.Context, _ *lease.Lease) error {
			trap.Arm()
			<-fctx.Done()
			cause = context.Cause(fctx)
			return nil
		})
	})
	require.ErrorIs(t, cause, lease.ErrLeaseLost)
	require.ErrorIs(t, cause, boom)
}
