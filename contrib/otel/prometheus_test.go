package pgxlockotel_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
	"github.com/pgxlock/pgxlock/metrics"
)

// feed sends one of every event to t.
func feed(t interface {
	advisory.AcquireTracer
	advisory.ReleaseTracer
	advisory.LostTracer
	lease.RenewTracer
}) {
	ctx := context.Background()
	start := advisory.TraceAcquireStartData{Keys: []keys.Key{keys.Int64(1)}, Scope: advisory.ScopeSession}
	ctx = t.TraceAcquireStart(ctx, start)
	t.TraceAcquireEnd(ctx, advisory.TraceAcquireEndData{TraceAcquireStartData: start, Outcome: advisory.OutcomeAcquired})
	t.TraceRelease(ctx, advisory.TraceReleaseData{Keys: start.Keys, Scope: start.Scope})
	ctx = t.TraceAcquireStart(context.Background(), start)
	t.TraceAcquireEnd(ctx, advisory.TraceAcquireEndData{TraceAcquireStartData: start, Outcome: advisory.OutcomeAcquired})
	t.TraceLost(ctx, advisory.TraceLostData{Keys: start.Keys, Err: advisory.ErrLockLost})
	t.TraceRenew(context.Background(), lease.TraceRenewData{Form: lease.FormManager, Err: errors.New("x")})
}

// families returns "name type label,label" per family gathered from g.
func families(t *testing.T, g prometheus.Gatherer) []string {
	mfs, err := g.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !strings.HasPrefix(lp.GetName(), "otel_") {
					labels[lp.GetName()] = true
				}
			}
		}
		var names []string
		for n := range labels {
			names = append(names, n)
		}
		sort.Strings(names)
		out = append(out, mf.GetName()+" "+dto.MetricType_name[int32(mf.GetType())]+" "+strings.Join(names, ","))
	}
	sort.Strings(out)
	return out
}

// Exported through OpenTelemetry's Prometheus exporter, the instruments are
// the Prometheus collector's families, of the same types, as the package
// documentation's table says: the two duration histograms named by the
// semantic conventions (pgxlock_lock_wait_duration_seconds,
// pgxlock_lock_hold_duration_seconds), every label with the pgxlock_ prefix,
// and error_type on failures.
func TestPrometheusExporterMatchesCollector(t *testing.T) {
	col := metrics.New(metrics.Options{})
	regCol := prometheus.NewPedanticRegistry()
	require.NoError(t, regCol.Register(col))
	feed(col)

	regOtel := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(regOtel), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tr, err := pgxlockotel.New(pgxlockotel.Config{MeterProvider: mp})
	require.NoError(t, err)
	feed(tr)

	names := map[string]string{
		"pgxlock_wait_seconds": "pgxlock_lock_wait_duration_seconds",
		"pgxlock_hold_seconds": "pgxlock_lock_hold_duration_seconds",
	}
	var want []string
	for _, f := range families(t, regCol) {
		parts := strings.Split(f, " ")
		name, typ, labels := parts[0], parts[1], strings.Split(parts[2], ",")
		if n, ok := names[name]; ok {
			name = n
		}
		for i, l := range labels {
			labels[i] = "pgxlock_" + l
		}
		if name == "pgxlock_lease_renewals_total" { // feed's renewal failed
			labels = append(labels, "error_type")
		}
		sort.Strings(labels)
		want = append(want, name+" "+typ+" "+strings.Join(labels, ","))
	}
	sort.Strings(want)
	require.Len(t, want, 7)
	require.Equal(t, want, families(t, regOtel))
}
