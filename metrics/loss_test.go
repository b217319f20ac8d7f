package metrics_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/metrics"
)

// killAtGrant terminates the backend holding key when an acquisition
// succeeds, before the call returns (so Lock.Unlock or Hold's unlock, not
// the watcher, usually finds the loss).
type killAtGrant struct {
	t     *testing.T
	admin *pgxpool.Pool
	key   keys.Key
	on    bool
}

func (k *killAtGrant) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}

func (k *killAtGrant) TraceAcquireEnd(ctx context.Context, d advisory.TraceAcquireEndData) {
	if !k.on || d.Outcome != advisory.OutcomeAcquired {
		return
	}
	infos, err := advisory.ListLocks(ctx, k.admin, k.key)
	require.NoError(k.t, err)
	require.Len(k.t, infos, 1)
	kill(ctx, k.t, k.admin, uint32(infos[0].PID))
}

// kill terminates backend pid and waits until it has exited.
func kill(ctx context.Context, t *testing.T, admin *pgxpool.Pool, pid uint32) {
	var ok bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", int32(pid)).Scan(&ok))
	require.True(t, ok)
}

// lossNS registers the test's namespace once per test binary (-count=N
// runs the test again; a name registers with one id only).
func lossNS(t *testing.T) keys.Namespace {
	lossNSOnce.Do(func() { lossNSValue = keys.MustRegisterNamespace(pgtest.UniqueInt32(t), "loss_metrics_test") })
	return lossNSValue
}

var (
	lossNSOnce  sync.Once
	lossNSValue keys.Namespace
)

// TestLostCountedOnceWhoeverSeesIt: pgxlock_lost_total counts each lost
// lock once, whether the watcher, Lock.Unlock, Hold's unlock or WithLock's
// unlock saw the loss, and pgxlock_held comes back to 0 (no release is
// counted on top of the loss).
func TestLostCountedOnceWhoeverSeesIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	admin := pgtest.Pool(t)
	ns := lossNS(t)
	k := ns.Key(1)
	killer := &killAtGrant{t: t, admin: admin, key: k}
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: advisory.MultiTracer{m, killer}})
	require.NoError(t, err)
	lost := 0

	// The watcher sees it: Done closes before Unlock.
	h, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	infos, err := advisory.ListLocks(ctx, admin, k)
	require.NoError(t, err)
	kill(ctx, t, admin, uint32(infos[0].PID))
	<-h.Done()
	require.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
	lost++

	// Unlock or Hold's unlock sees it (killed at the grant).
	killer.on = true
	for range 5 {
		h, err := l.Lock(ctx, k, nil)
		require.NoError(t, err)
		require.ErrorIs(t, h.Unlock(ctx), advisory.ErrLockLost)
		require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
		lost++
		require.ErrorIs(t, l.Hold(ctx, k, nil, func(context.Context) error { return nil }), advisory.ErrLockLost)
		lost++
	}
	killer.on = false

	// WithLock's and WithLockAll's unlock sees it.
	die := func(ctx context.Context, conn *pgx.Conn) error {
		kill(ctx, t, admin, conn.PgConn().PID())
		return nil
	}
	require.ErrorIs(t, l.WithLock(ctx, k, nil, die), advisory.ErrLockLost)
	lost++
	require.ErrorIs(t, l.WithLockAll(ctx, []keys.Key{k, ns.Key(2)}, nil, die), advisory.ErrLockLost)
	lost++

	body := scrape(t, reg)
	for _, want := range []string{
		fmt.Sprintf(`pgxlock_lost_total{namespace="loss_metrics_test"} %d`, lost),
		fmt.Sprintf(`pgxlock_hold_seconds_count{mode="exclusive",namespace="loss_metrics_test",scope="session"} %d`, lost),
		`pgxlock_held{mode="exclusive",namespace="loss_metrics_test",scope="session"} 0`,
	} {
		assert.Contains(t, body, want)
	}
}
