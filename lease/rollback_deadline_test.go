package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// onBatchError is a pgx tracer that calls fire, once, when a batch ends
// with an error while armed: the network can then freeze between a failed
// statement and exec's ROLLBACK, without timing.
type onBatchError struct {
	armed atomic.Bool
	fired atomic.Bool
	fire  func()
}

func (o *onBatchError) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (o *onBatchError) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (o *onBatchError) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (o *onBatchError) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (o *onBatchError) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	if d.Err != nil && o.armed.Load() && o.fired.CompareAndSwap(false, true) {
		o.fire()
	}
}

// TestTryAcquireAllRollbackFrozenOvershoots: TryAcquireAll took "a", then
// b's attempt failed on the server (55P03: b's counter row is locked by a
// transaction) and the network froze before exec's ROLLBACK. The ROLLBACK
// had a fresh ReleaseTimeout of its own and the give-back of "a" another:
// deadline + 2 ReleaseTimeouts. The whole call must share one clean-up
// bound: within deadline + one ReleaseTimeout.
func TestTryAcquireAllRollbackFrozenOvershoots(t *testing.T) {
	const deadline, releaseTimeout = 300 * time.Millisecond, 3 * time.Second
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	direct := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	l, err := direct.TryAcquire(ctx, "b", nil) // creates b's counter row
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	proxy := newFreezeProxy(t, p1.Config().ConnConfig.Host, p1.Config().ConnConfig.Port)
	tracer := &onBatchError{fire: func() { proxy.frozen.Store(true) }}
	via := viaPool(t, int(proxy.port), tracer)
	t.Cleanup(func() { proxy.frozen.Store(false) })
	m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute, ReleaseTimeout: releaseTimeout})
	require.NoError(t, err)
	require.NoError(t, via.Ping(ctx))

	tx, err := p1.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+schema+".pgxlock_leases_resources WHERE resource = 'b' FOR UPDATE")
	require.NoError(t, err)

	tracer.armed.Store(true)
	actx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	ls, err := m.TryAcquireAll(actx, []string{"a", "b"}, nil)
	took := time.Since(start)
	t.Logf("returned after %v: %v", took, err)
	require.Error(t, err)
	assert.Nil(t, ls)
	require.True(t, tracer.fired.Load(), "b's attempt failed on the server")
	assert.ErrorIs(t, err, lease.ErrNotAcquired)
	assert.ErrorIs(t, err, lease.ErrNotReleased, "a could not be given back through the frozen network")
	_, isError := err.(*lease.Error)
	assert.True(t, isError, "the error is %T, not *lease.Error", err)
	// Two bounds would be deadline + 6s; the slack is for a loaded machine.
	assert.Less(t, took, deadline+releaseTimeout+releaseTimeout/2)
	// What could not be given back is held until its TTL.
	hs, err := direct.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, "a", hs[0].Resource)
}

// TestDoReleaseRollbackFrozenOvershoots: Do's bounded release whose
// statement fails on the server (a trigger that first sleeps, then raises)
// and whose ROLLBACK then meets a frozen network: the ROLLBACK once had a
// fresh ReleaseTimeout inside the release's own, so the release took up to
// two. It must take at most one.
func TestDoReleaseRollbackFrozenOvershoots(t *testing.T) {
	const releaseTimeout = 3 * time.Second
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	mustExec(t, p1, `CREATE FUNCTION `+schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RAISE EXCEPTION 'refused'; END $$`)
	mustExec(t, p1, `CREATE TRIGGER refuse BEFORE DELETE ON `+schema+`.pgxlock_leases FOR EACH ROW EXECUTE FUNCTION `+schema+`.refuse()`)
	proxy := newFreezeProxy(t, p1.Config().ConnConfig.Host, p1.Config().ConnConfig.Port)
	tracer := &onBatchError{fire: func() { proxy.frozen.Store(true) }}
	via := viaPool(t, int(proxy.port), tracer)
	t.Cleanup(func() { proxy.frozen.Store(false) })
	m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute, ReleaseTimeout: releaseTimeout})
	require.NoError(t, err)

	var done time.Time
	err = m.TryDo(ctx, "r", nil, func(context.Context, *lease.Lease) error {
		tracer.armed.Store(true)
		done = time.Now()
		return nil
	})
	took := time.Since(done)
	t.Logf("release took %v: %v", took, err)
	require.True(t, tracer.fired.Load(), "the release failed on the server")
	assert.ErrorIs(t, err, lease.ErrNotReleased)
	// Two bounds would be 2s + 3s; the slack is for a loaded machine.
	assert.Less(t, took, releaseTimeout+time.Second)
}
