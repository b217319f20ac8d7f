package lease_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/lease"
)

// onBatch is a pgx tracer that calls fire, once, just before the first batch
// with an argument equal to arg is sent, unless held is set: it lets a test
// cut the network at an exact step of a multi-statement call, without
// timing.
type onBatch struct {
	arg   string
	held  atomic.Bool
	fired atomic.Bool
	fire  func()
}

func (o *onBatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (o *onBatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (o *onBatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		for _, a := range q.Arguments {
			if s, ok := a.(string); ok && s == o.arg && !o.held.Load() && o.fired.CompareAndSwap(false, true) {
				o.fire()
				return ctx
			}
		}
	}
	return ctx
}
func (o *onBatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (o *onBatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// viaPool returns a pool whose connections go through 127.0.0.1:port, with
// tracer on every connection.
func viaPool(t *testing.T, port int, tracer pgx.QueryTracer) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(port)
	cfg.ConnConfig.Fallbacks = nil
	// Longer than any ReleaseTimeout here: a connection attempt into a
	// frozen network lasts as long as the caller's context allows.
	cfg.ConnConfig.ConnectTimeout = 30 * time.Second
	cfg.ConnConfig.Tracer = tracer
	return pgtest.NewPool(t, cfg)
}

// Issue 21 item 4: through a frozen network (deadline 1s, ReleaseTimeout
// 2s), TryAcquireAll and AcquireAll returned after 5s: the failed
// acquisition's give-back and the release of the leases already taken ran
// one after the other, each bounded by ReleaseTimeout. They must run under
// one bound: the call returns within deadline + one ReleaseTimeout.
func TestAcquireAllDeadlineThroughFrozenNetwork(t *testing.T) {
	const deadline, releaseTimeout = time.Second, 3 * time.Second
	for name, all := range map[string]func(*lease.Manager, context.Context, []string) ([]*lease.Lease, error){
		"try acquire all": func(m *lease.Manager, ctx context.Context, rs []string) ([]*lease.Lease, error) {
			return m.TryAcquireAll(ctx, rs, nil)
		},
		"acquire all": func(m *lease.Manager, ctx context.Context, rs []string) ([]*lease.Lease, error) {
			return m.AcquireAll(ctx, rs, nil)
		},
	} {
		t.Run(name, func(t *testing.T) {
			p1, _, schema := twoPools(t)
			ctx := testCtx(t)
			newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
			proxy := newFreezeProxy(t, p1.Config().ConnConfig.Host, p1.Config().ConnConfig.Port)
			// Frozen just before the acquisition of a2 is sent: a1 is held.
			via := viaPool(t, int(proxy.port), &onBatch{arg: "a2", fire: func() { proxy.frozen.Store(true) }})
			t.Cleanup(func() { proxy.frozen.Store(false) }) // runs before the pool's checks
			m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute, ReleaseTimeout: releaseTimeout})
			require.NoError(t, err)

			actx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			ls, err := all(m, actx, []string{"a1", "a2", "a3"})
			took := time.Since(start)
			t.Logf("returned after %v: %v", took, err)
			require.Error(t, err)
			assert.Nil(t, ls)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, err, lease.ErrNotReleased, "a1 could not be given back through the frozen network")
			// The bound is deadline + one ReleaseTimeout; the slack is for a
			// loaded machine, and is below the second ReleaseTimeout a serial
			// clean-up adds.
			assert.Less(t, took, deadline+releaseTimeout+2*time.Second)
		})
	}
}

// Issue 21 item 4: every lease AcquireAll took is given back when a later
// acquisition's outcome is unknown. The connection that carries the
// acquisition of a2 goes silent (tcpproxy.Cut) just before a2 is sent; new
// connections still get through, so every give-back can reach the server,
// within the one shared bound.
func TestAcquireAllGivesBackEveryLease(t *testing.T) {
	const deadline, releaseTimeout = time.Second, 5 * time.Second
	for _, try := range []bool{true, false} {
		t.Run("try="+strconv.FormatBool(try), func(t *testing.T) {
			p1, _, schema := twoPools(t)
			ctx := testCtx(t)
			observer := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
			proxy, err := tcpproxy.New("tcp", net.JoinHostPort(p1.Config().ConnConfig.Host, strconv.Itoa(int(p1.Config().ConnConfig.Port))))
			require.NoError(t, err)
			t.Cleanup(proxy.Close)
			via := viaPool(t, proxy.Port(), &onBatch{arg: "a2", fire: func() { proxy.Cut() }})
			m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute, ReleaseTimeout: releaseTimeout})
			require.NoError(t, err)

			actx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			var ls []*lease.Lease
			if try {
				ls, err = m.TryAcquireAll(actx, []string{"a1", "a2", "a3"}, nil)
			} else {
				ls, err = m.AcquireAll(actx, []string{"a1", "a2", "a3"}, nil)
			}
			took := time.Since(start)
			t.Logf("returned after %v: %v", took, err)
			require.Error(t, err)
			assert.Nil(t, ls)
			assert.NotErrorIs(t, err, lease.ErrNotReleased)
			assert.Less(t, took, deadline+releaseTimeout+2*time.Second)
			hs, err := observer.List(ctx, &lease.ListOptions{IncludeExpired: true})
			require.NoError(t, err)
			assert.Empty(t, hs, "every lease the call took was given back")
		})
	}
}
