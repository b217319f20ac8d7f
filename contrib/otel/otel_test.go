package pgxlockotel_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
)

const waitBound = 20 * time.Second

// testNS is registered once per test binary (-count=N runs tests again), with
// a random id: its keys are this process's own.
var testNS = func() keys.Namespace {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return keys.MustRegisterNamespace(int32(binary.BigEndian.Uint32(b[:])|1), "oteltest")
}()

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newTracer(t *testing.T) (*pgxlockotel.Tracer, *tracetest.SpanRecorder, *sdkmetric.ManualReader) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	tr, err := pgxlockotel.New(pgxlockotel.Config{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	return tr, sr, reader
}

// attrs flattens a span's attributes.
func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, e := range s.Events() {
		names = append(names, e.Name)
	}
	return names
}

// Every event of a sequence (WithLock, a busy TryWithLock, a timeout, a
// shared multi-key transaction lock, a Hold whose connection is killed, two
// lease renewals) shows up as a span with its attributes and events, and in
// the metrics with the Prometheus collector's instruments and labels. No
// span or metric carries a key or a hashed source string.
func TestSequenceSpansAndMetrics(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	tr, sr, reader := newTracer(t)
	l, err := advisory.New(pool, advisory.Config{Tracer: tr})
	require.NoError(t, err)
	ns := testNS
	k1, k2 := ns.Key(1), ns.Key(2)
	const secret = "customer-4711-invoice"
	hashed := keys.Hash(secret + strconv.FormatInt(pgtest.UniqueInt64(t), 10))

	// 1. WithLock: acquired, released.
	require.NoError(t, l.WithLock(ctx, k1, nil, func(context.Context, *pgx.Conn) error { return nil }))
	// 2. Busy, and 3. timeout, against a held handle.
	h, err := l.Lock(ctx, hashed, nil)
	require.NoError(t, err)
	require.ErrorIs(t, l.TryWithLock(ctx, hashed, nil, func(context.Context, *pgx.Conn) error { return nil }), advisory.ErrNotAcquired)
	require.ErrorIs(t, l.WithLock(ctx, hashed, &advisory.Options{Timeout: 50 * time.Millisecond},
		func(context.Context, *pgx.Conn) error { return nil }), advisory.ErrLockTimeout)
	require.NoError(t, h.Unlock(ctx))
	// 4. A shared transaction lock on two keys.
	require.NoError(t, l.WithXactLockAll(ctx, []keys.Key{k2, k1}, &advisory.Options{Shared: true},
		func(context.Context, pgx.Tx) error { return nil }))
	// 5. A Hold whose backend is terminated: lost.
	check := pgtest.Pool(t)
	err = l.Hold(ctx, k2, nil, func(hctx context.Context) error {
		c, o, s := k2.PgLocks()
		_, err := check.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'
			AND granted AND classid = $1 AND objid = $2 AND objsubid = $3`, c, o, s)
		require.NoError(t, err)
		select {
		case <-hctx.Done():
			return nil
		case <-time.After(waitBound):
			return errors.New("loss not seen")
		}
	})
	require.ErrorIs(t, err, advisory.ErrLockLost)
	// 6. Lease renewals: one ok, one after the release (lost).
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: pgtest.Schema(t, pool), Table: "leases", TTL: time.Minute, Tracer: tr})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctx))
	ls, err := m.TryAcquire(ctx, secret, nil)
	require.NoError(t, err)
	require.NoError(t, ls.Renew(ctx))
	require.NoError(t, ls.Release(ctx))
	require.ErrorIs(t, ls.Renew(ctx), lease.ErrLeaseLost)

	// Spans.
	spans := sr.Ended()
	var lockSpans, renewSpans []sdktrace.ReadOnlySpan
	for _, s := range spans {
		switch s.Name() {
		case pgxlockotel.SpanLock:
			lockSpans = append(lockSpans, s)
		case pgxlockotel.SpanRenew:
			renewSpans = append(renewSpans, s)
		}
	}
	require.Len(t, lockSpans, 6, "one span per acquisition, all ended")
	require.Len(t, sr.Started(), len(spans), "no span left open")
	type want struct {
		scope, mode, result, ns string
		try                     bool
		n                       int64
		events                  []string
		status                  codes.Code
	}
	ended := []want{
		{"session", "exclusive", "acquired", "oteltest", false, 1, []string{pgxlockotel.EventAcquired, pgxlockotel.EventReleased}, codes.Unset},
		{"session", "exclusive", "busy", "none", true, 1, nil, codes.Unset},
		{"session", "exclusive", "timeout", "none", false, 1, nil, codes.Error},
		{"session", "exclusive", "acquired", "none", false, 1, []string{pgxlockotel.EventAcquired, pgxlockotel.EventReleased}, codes.Unset},
		{"xact", "shared", "acquired", "oteltest", false, 2, []string{pgxlockotel.EventAcquired, pgxlockotel.EventReleased}, codes.Unset},
		{"session", "exclusive", "acquired", "oteltest", false, 1, []string{pgxlockotel.EventAcquired, pgxlockotel.EventLost}, codes.Error},
	}
	for i, s := range lockSpans {
		a := attrs(s.Attributes())
		w := ended[i]
		require.Equal(t, w.scope, a[pgxlockotel.AttrScope].AsString(), "span %d", i)
		require.Equal(t, w.mode, a[pgxlockotel.AttrMode].AsString(), "span %d", i)
		require.Equal(t, w.result, a[pgxlockotel.AttrResult].AsString(), "span %d", i)
		require.Equal(t, w.ns, a[pgxlockotel.AttrNamespace].AsString(), "span %d", i)
		require.Equal(t, w.try, a[pgxlockotel.AttrTry].AsBool(), "span %d", i)
		require.Equal(t, w.n, a[pgxlockotel.AttrKeyCount].AsInt64(), "span %d", i)
		require.GreaterOrEqual(t, a[pgxlockotel.AttrWaitSeconds].AsFloat64(), 0.0, "span %d", i)
		require.Contains(t, a, pgxlockotel.AttrWaitSeconds, "span %d", i)
		require.Equal(t, w.events, eventNames(s), "span %d", i)
		require.Equal(t, w.status, s.Status().Code, "span %d", i)
		for _, e := range s.Events() {
			if e.Name != pgxlockotel.EventAcquired {
				require.Contains(t, attrs(e.Attributes), pgxlockotel.AttrHoldSeconds, "span %d event %s", i, e.Name)
			}
		}
	}
	// The handle's span (index 3 ended after busy and timeout) outlived them.
	require.True(t, lockSpans[3].StartTime().Before(lockSpans[1].StartTime()))

	require.Len(t, renewSpans, 2)
	for i, res := range []string{"ok", "lost"} {
		a := attrs(renewSpans[i].Attributes())
		require.Equal(t, res, a[pgxlockotel.AttrResult].AsString())
		require.Equal(t, "manager", a[pgxlockotel.AttrLeaseForm].AsString())
		require.Equal(t, ls.Token(), a[pgxlockotel.AttrLeaseToken].AsInt64())
	}

	// Nothing names a key or the hashed source string.
	v, _ := hashed.Int64()
	for _, s := range spans {
		kvs := s.Attributes()
		for _, e := range s.Events() {
			kvs = append(kvs, e.Attributes...)
		}
		for _, kv := range kvs {
			str := kv.Value.Emit()
			require.NotContains(t, str, secret)
			require.NotContains(t, str, strconv.FormatInt(v, 10))
		}
	}

	// Metrics.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			got[mm.Name] = mm.Data
		}
	}
	sums := func(name string) map[string]int64 {
		out := map[string]int64{}
		for _, dp := range got[name].(metricdata.Sum[int64]).DataPoints {
			var parts []string
			for _, kv := range dp.Attributes.ToSlice() {
				parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
			}
			out[strings.Join(parts, ",")] += dp.Value
		}
		return out
	}
	require.Equal(t, map[string]int64{
		"mode=exclusive,namespace=oteltest,result=acquired,scope=session": 2,
		"mode=exclusive,namespace=none,result=acquired,scope=session":     1,
		"mode=exclusive,namespace=none,result=busy,scope=session":         1,
		"mode=exclusive,namespace=none,result=timeout,scope=session":      1,
		"mode=shared,namespace=oteltest,result=acquired,scope=xact":       1,
	}, sums("pgxlock.acquisitions"))
	for _, name := range []string{"pgxlock.held", "pgxlock.waiting"} {
		for set, n := range sums(name) {
			require.Zero(t, n, "%s{%s}", name, set)
		}
	}
	require.Equal(t, map[string]int64{"namespace=oteltest": 1}, sums("pgxlock.lost"))
	require.Equal(t, map[string]int64{"result=ok": 1, "result=lost": 1}, sums("pgxlock.lease_renewals"))
	count := func(name string) (n uint64) {
		for _, dp := range got[name].(metricdata.Histogram[float64]).DataPoints {
			n += dp.Count
		}
		return n
	}
	require.EqualValues(t, 6, count("pgxlock.wait"))
	require.EqualValues(t, 4, count("pgxlock.hold"), "3 releases and 1 loss")
}
