package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
	"github.com/pgxlock/pgxlock/metrics"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func TestCollectorScrapedThroughPromhttp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{ConstLabels: prometheus.Labels{"service": "test"}})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))

	billing := keys.MustRegisterNamespace(pgtest.UniqueInt32(t), "billing_metrics_test")
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: m, LockTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	other, err := advisory.New(pgtest.Pool(t), advisory.Config{})
	require.NoError(t, err)

	k := billing.Key(1)
	noop := func(context.Context, *pgx.Conn) error { return nil }
	require.NoError(t, l.WithLock(ctx, k, nil, noop))
	require.NoError(t, l.WithXactLock(ctx, keys.Hash("secret-source-string"), &advisory.Options{Shared: true},
		func(context.Context, pgx.Tx) error { return nil }))

	h, err := other.Lock(ctx, k, nil)
	require.NoError(t, err)
	assert.ErrorIs(t, l.TryWithLock(ctx, k, nil, noop), advisory.ErrNotAcquired)
	assert.ErrorIs(t, l.WithLock(ctx, k, nil, noop), advisory.ErrLockTimeout)
	require.NoError(t, h.Unlock(ctx))

	held, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	body := scrape(t, reg)
	assert.Contains(t, body, `pgxlock_held{mode="exclusive",namespace="billing_metrics_test",scope="session",service="test"} 1`)

	// Lose it: terminate its backend.
	infos, err := advisory.ListLocks(ctx, pgtest.Pool(t), k)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	_, err = pgtest.Pool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", infos[0].PID)
	require.NoError(t, err)
	<-held.Done()
	require.ErrorIs(t, held.Unlock(ctx), advisory.ErrLockLost)

	body = scrape(t, reg)
	for _, want := range []string{
		`pgxlock_acquisitions_total{mode="exclusive",namespace="billing_metrics_test",result="acquired",scope="session",service="test"} 2`,
		`pgxlock_acquisitions_total{mode="exclusive",namespace="billing_metrics_test",result="busy",scope="session",service="test"} 1`,
		`pgxlock_acquisitions_total{mode="exclusive",namespace="billing_metrics_test",result="timeout",scope="session",service="test"} 1`,
		`pgxlock_acquisitions_total{mode="shared",namespace="none",result="acquired",scope="xact",service="test"} 1`,
		`pgxlock_held{mode="exclusive",namespace="billing_metrics_test",scope="session",service="test"} 0`,
		`pgxlock_held{mode="shared",namespace="none",scope="xact",service="test"} 0`,
		`pgxlock_waiting{mode="exclusive",namespace="billing_metrics_test",scope="session",service="test"} 0`,
		`pgxlock_lost_total{namespace="billing_metrics_test",service="test"} 1`,
		`pgxlock_wait_seconds_count{mode="exclusive",namespace="billing_metrics_test",scope="session",service="test"} 4`,
		`pgxlock_hold_seconds_count{mode="exclusive",namespace="billing_metrics_test",scope="session",service="test"} 2`,
	} {
		assert.Contains(t, body, want)
	}
	assert.NotContains(t, body, "secret-source-string")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "pgxlock_") {
			assert.NotContains(t, line, "key=", "no key label: cardinality stays bounded")
		}
	}
}

func TestNamespaceLabelMixedAndNone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{Namespace: "app"})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	a := keys.MustRegisterNamespace(pgtest.UniqueInt32(t), "ns_a_metrics_test")
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: m})
	require.NoError(t, err)
	require.NoError(t, l.WithXactLockAll(ctx, []keys.Key{a.Key(1), keys.Int64(pgtest.UniqueInt64(t))}, nil,
		func(context.Context, pgx.Tx) error { return nil }))
	body := scrape(t, reg)
	assert.Contains(t, body, `app_acquisitions_total{mode="exclusive",namespace="mixed",result="acquired",scope="xact"} 1`)
}

func TestLeaseRenewalsCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	pool := pgtest.Pool(t)
	mgr, err := lease.NewManager(pool, lease.ManagerConfig{Schema: pgtest.Schema(t, pool), TTL: time.Minute, Tracer: m})
	require.NoError(t, err)
	require.NoError(t, mgr.Migrate(ctx))
	l, err := mgr.TryAcquire(ctx, "report", nil)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Renew(ctx), lease.ErrLeaseLost)
	body := scrape(t, reg)
	assert.Contains(t, body, `pgxlock_lease_renewals_total{result="ok"} 2`)
	assert.Contains(t, body, `pgxlock_lease_renewals_total{result="lost"} 1`)
	assert.NotContains(t, body, `"report"`, "resources never become labels")
}

// The counters alerts take increase() of exist at zero before any event:
// pgxlock_lost_total for "none", "mixed" and each listed namespace, and
// pgxlock_lease_renewals_total for each result. Without them the first loss
// is a series appearing at 1, which increase() does not count.
func TestAlertedSeriesExistAtZero(t *testing.T) {
	ns := keys.MustRegisterNamespace(pgtest.UniqueInt32(t), "alerted_"+strings.ReplaceAll(t.Name(), "/", "_"))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics.New(metrics.Options{Namespaces: []keys.Namespace{ns}})))
	body := scrape(t, reg)
	for _, line := range []string{
		`pgxlock_lost_total{namespace="none"} 0`,
		`pgxlock_lost_total{namespace="mixed"} 0`,
		`pgxlock_lost_total{namespace="` + ns.Name() + `"} 0`,
		`pgxlock_lease_renewals_total{result="ok"} 0`,
		`pgxlock_lease_renewals_total{result="lost"} 0`,
		`pgxlock_lease_renewals_total{result="error"} 0`,
	} {
		assert.Contains(t, body, "\n"+line+"\n", "before any event")
	}
}

// Review 15c: a column lease's renewal that finds its row gone
// (ErrNotFound), which Do reads as the loss, was counted as "error".
func TestLeaseRenewalOfDeletedRowCountsAsLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))
	pool := pgtest.Pool(t)
	table := pgx.Identifier{pgtest.Schema(t, pool), "items"}
	_, err := pool.Exec(ctx, "CREATE TABLE "+table.Sanitize()+" (id bigint PRIMARY KEY); INSERT INTO "+table.Sanitize()+" VALUES (1)")
	require.NoError(t, err)
	col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: table[0], Table: table[1], TTL: time.Minute, Tracer: m})
	require.NoError(t, err)
	require.NoError(t, col.Migrate(ctx))
	l, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DELETE FROM "+table.Sanitize())
	require.NoError(t, err)
	require.ErrorIs(t, l.Renew(ctx), lease.ErrNotFound)
	body := scrape(t, reg)
	assert.Contains(t, body, `pgxlock_lease_renewals_total{result="lost"} 1`)
	assert.Contains(t, body, `pgxlock_lease_renewals_total{result="error"} 0`)
}
