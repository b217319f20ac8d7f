package pgxlockotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// A loss that WithLock's unlock finds (the callback's backend was
// terminated) is one loss event on the lock's hold span, which ends once
// with an error status, and one pgxlock.lost; pgxlock.held comes back to 0.
func TestLossFoundByUnlockIsOneLossEvent(t *testing.T) {
	ctx := testCtx(t)
	tr, sr, reader := newTracer(t)
	admin := pgtest.Pool(t)
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: tr})
	require.NoError(t, err)
	k := testNS.Key(int32(pgtest.UniqueInt64(t)))
	err = l.WithLock(ctx, k, nil, func(ctx context.Context, conn *pgx.Conn) error {
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", int32(conn.PgConn().PID())).Scan(&ok))
		require.True(t, ok)
		return nil
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)

	var holds int
	for _, s := range sr.Ended() {
		if s.Name() != pgxlockotel.SpanHold {
			continue
		}
		holds++
		require.Equal(t, []string{pgxlockotel.EventLost}, eventNames(s))
		require.Equal(t, codes.Error, s.Status().Code)
	}
	require.Equal(t, 1, holds, "one hold span, ended once")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if s, ok := mm.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range s.DataPoints {
					sums[mm.Name] += dp.Value
				}
			}
		}
	}
	require.Equal(t, int64(1), sums["pgxlock.lost"], "one loss")
	require.Zero(t, sums["pgxlock.held"])
}
