package metrics_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/metrics"
)

// Review round 13: unsorted buckets were accepted by New and made
// Prometheus panic at the first observation, inside a lock call (which
// leaked the lock and the connection). They are used sorted, without
// duplicates, NaN or +Inf.
func TestBucketsAreSortedAndCleaned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{WaitBuckets: []float64{1, 0.5, 0.5, math.NaN(), math.Inf(1)}, HoldBuckets: []float64{math.NaN()}})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: m})
	require.NoError(t, err)
	require.NotPanics(t, func() {
		require.NoError(t, l.WithLock(ctx, keys.Int64(pgtest.UniqueInt64(t)), nil, func(context.Context, *pgx.Conn) error { return nil }))
	})
	out := scrape(t, reg)
	assert.Contains(t, out, `pgxlock_wait_seconds_bucket{mode="exclusive",namespace="none",scope="session",le="0.5"}`)
	assert.Contains(t, out, `pgxlock_wait_seconds_bucket{mode="exclusive",namespace="none",scope="session",le="1"}`)
	assert.Equal(t, 3, strings.Count(out, "pgxlock_wait_seconds_bucket{"), "0.5, 1 and +Inf:\n%s", out)
	assert.Contains(t, out, `pgxlock_hold_seconds_bucket{mode="exclusive",namespace="none",scope="session",le="3600"}`, "nothing left: the defaults")
}

// Review round 13: LockInTx's acquisitions were counted in pgxlock_held,
// which no release event ever brought down (the caller's COMMIT is not the
// library's to see): 5 committed LockInTx left the gauge at 5.
func TestHeldGaugeLeavesOutLocksInTheCallersTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	pool := pgtest.Pool(t)
	l, err := advisory.New(pool, advisory.Config{Tracer: m})
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := l.LockInTx(ctx, tx, keys.Int64(pgtest.UniqueInt64(t)), nil); err != nil {
				return err
			}
			return l.TryLockAllInTx(ctx, tx, []keys.Key{keys.Int64(pgtest.UniqueInt64(t)), keys.Int64(pgtest.UniqueInt64(t))}, nil)
		}))
	}
	out := scrape(t, reg)
	assert.Contains(t, out, `pgxlock_acquisitions_total{mode="exclusive",namespace="none",result="acquired",scope="xact"} 10`, "counted as acquisitions")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "pgxlock_held{") {
			assert.True(t, strings.HasSuffix(line, " 0"), line)
		}
	}
	assert.NotContains(t, out, "pgxlock_hold_seconds_count{", "no hold time for a lock whose end is not seen")
}
