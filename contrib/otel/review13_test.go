package pgxlockotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Review round 13: a LockInTx started a hold span that no event ever ended
// (its release, the caller's COMMIT, is not traced), and pgxlock.held kept
// counting it. A lock in the caller's transaction has its acquisition span
// only; WithXactLock keeps its hold span.
func TestLockInTxHasNoHoldSpan(t *testing.T) {
	ctx := testCtx(t)
	tr, sr, reader := newTracer(t)
	pool := pgtest.Pool(t)
	l, err := advisory.New(pool, advisory.Config{Tracer: tr})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return l.LockInTx(ctx, tx, keys.Int64(pgtest.UniqueInt64(t)), nil)
	}))
	require.NoError(t, l.WithXactLock(ctx, keys.Int64(pgtest.UniqueInt64(t)), nil, func(context.Context, pgx.Tx) error { return nil }))

	started, ended := 0, 0
	for _, s := range sr.Started() {
		if s.Name() == pgxlockotel.SpanHold {
			started++
		}
	}
	for _, s := range sr.Ended() {
		if s.Name() == pgxlockotel.SpanHold {
			ended++
		}
	}
	require.Equal(t, 1, started, "WithXactLock's hold span only")
	require.Equal(t, 1, ended)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if mm.Name != pgxlockotel.MetricHeld {
				continue
			}
			for _, dp := range mm.Data.(metricdata.Sum[int64]).DataPoints {
				require.Zero(t, dp.Value, "pgxlock.held")
			}
		}
	}
}
