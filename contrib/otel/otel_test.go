package pgxlockotel_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
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
	var acquireSpans, holdSpans, renewSpans []sdktrace.ReadOnlySpan
	for _, s := range spans {
		switch s.Name() {
		case pgxlockotel.SpanAcquire:
			acquireSpans = append(acquireSpans, s)
		case pgxlockotel.SpanHold:
			holdSpans = append(holdSpans, s)
		case pgxlockotel.SpanRenew:
			renewSpans = append(renewSpans, s)
		}
	}
	require.Len(t, acquireSpans, 6, "one span per acquisition, all ended")
	require.Len(t, holdSpans, 4, "one span per acquired lock, all ended")
	require.Len(t, sr.Started(), len(spans), "no span left open")
	type want struct {
		scope, mode, result, ns string
		try                     bool
		n                       int64
		errType                 string
		status                  codes.Code
	}
	acquired := []want{
		{"session", "exclusive", "acquired", "oteltest", false, 1, "", codes.Unset},
		{"session", "exclusive", "acquired", "none", false, 1, "", codes.Unset}, // the handle
		{"session", "exclusive", "busy", "none", true, 1, "", codes.Unset},
		{"session", "exclusive", "timeout", "none", false, 1, "timeout", codes.Error},
		{"xact", "shared", "acquired", "oteltest", false, 2, "", codes.Unset},
		{"session", "exclusive", "acquired", "oteltest", false, 1, "", codes.Unset}, // the Hold
	}
	for i, s := range acquireSpans {
		a := attrs(s.Attributes())
		w := acquired[i]
		require.Equal(t, "postgresql", a[pgxlockotel.AttrDBSystemName].AsString(), "span %d", i)
		require.Equal(t, w.scope, a[pgxlockotel.AttrScope].AsString(), "span %d", i)
		require.Equal(t, w.mode, a[pgxlockotel.AttrMode].AsString(), "span %d", i)
		require.Equal(t, w.result, a[pgxlockotel.AttrResult].AsString(), "span %d", i)
		require.Equal(t, w.ns, a[pgxlockotel.AttrNamespace].AsString(), "span %d", i)
		require.Equal(t, w.try, a[pgxlockotel.AttrTry].AsBool(), "span %d", i)
		require.Equal(t, w.n, a[pgxlockotel.AttrKeyCount].AsInt64(), "span %d", i)
		require.GreaterOrEqual(t, a[pgxlockotel.AttrWaitSeconds].AsFloat64(), 0.0, "span %d", i)
		require.Contains(t, a, pgxlockotel.AttrWaitSeconds, "span %d", i)
		require.Equal(t, w.errType, a[pgxlockotel.AttrErrorType].AsString(), "span %d", i)
		require.Empty(t, eventNames(s), "span %d", i)
		require.Equal(t, w.status, s.Status().Code, "span %d", i)
	}
	held := []struct {
		acquire int // index in acquireSpans
		event   string
		errType string
		status  codes.Code
	}{
		{0, pgxlockotel.EventReleased, "", codes.Unset},
		{1, pgxlockotel.EventReleased, "", codes.Unset}, // the handle, released after busy and timeout
		{4, pgxlockotel.EventReleased, "", codes.Unset},
		{5, pgxlockotel.EventLost, "lost", codes.Error},
	}
	for i, s := range holdSpans {
		w := held[i]
		acq := acquireSpans[w.acquire]
		a, aa := attrs(s.Attributes()), attrs(acq.Attributes())
		for _, k := range []attribute.Key{pgxlockotel.AttrDBSystemName, pgxlockotel.AttrScope, pgxlockotel.AttrMode, pgxlockotel.AttrNamespace, pgxlockotel.AttrKeyCount} {
			require.Equal(t, aa[k], a[k], "hold span %d: %s", i, k)
		}
		require.Equal(t, w.errType, a[pgxlockotel.AttrErrorType].AsString(), "hold span %d", i)
		require.Equal(t, []string{w.event}, eventNames(s), "hold span %d", i)
		require.Contains(t, attrs(s.Events()[0].Attributes), pgxlockotel.AttrHoldSeconds, "hold span %d", i)
		require.Equal(t, w.status, s.Status().Code, "hold span %d", i)
		require.Len(t, s.Links(), 1, "hold span %d", i)
		require.Equal(t, acq.SpanContext(), s.Links()[0].SpanContext, "hold span %d links its acquisition", i)
		require.False(t, s.StartTime().Before(acq.EndTime()), "hold span %d starts at the acquisition", i)
	}
	// The handle's hold (held[1]) outlived the busy and timeout acquisitions.
	require.True(t, holdSpans[1].EndTime().After(acquireSpans[3].EndTime()))

	require.Len(t, renewSpans, 2)
	for i, res := range []string{"ok", "lost"} {
		a := attrs(renewSpans[i].Attributes())
		require.Equal(t, res, a[pgxlockotel.AttrResult].AsString())
		require.Equal(t, "manager", a[pgxlockotel.AttrLeaseForm].AsString())
		require.Equal(t, ls.Token(), a[pgxlockotel.AttrLeaseToken].AsInt64())
		require.Equal(t, "postgresql", a[pgxlockotel.AttrDBSystemName].AsString())
		require.Equal(t, map[string]string{"ok": "", "lost": "lost"}[res], a[pgxlockotel.AttrErrorType].AsString())
	}

	// Nothing names a key or the hashed source string.
	v, _ := hashed.Int64()
	for _, s := range spans {
		kvs := s.Attributes()
		for _, e := range s.Events() {
			kvs = append(kvs, e.Attributes...)
		}
		for _, kv := range kvs {
			str := kv.Value.String()
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
				parts = append(parts, string(kv.Key)+"="+kv.Value.String())
			}
			out[strings.Join(parts, ",")] += dp.Value
		}
		return out
	}
	require.Equal(t, map[string]int64{
		"pgxlock.mode=exclusive,pgxlock.namespace=oteltest,pgxlock.result=acquired,pgxlock.scope=session":               2,
		"pgxlock.mode=exclusive,pgxlock.namespace=none,pgxlock.result=acquired,pgxlock.scope=session":                   1,
		"pgxlock.mode=exclusive,pgxlock.namespace=none,pgxlock.result=busy,pgxlock.scope=session":                       1,
		"error.type=timeout,pgxlock.mode=exclusive,pgxlock.namespace=none,pgxlock.result=timeout,pgxlock.scope=session": 1,
		"pgxlock.mode=shared,pgxlock.namespace=oteltest,pgxlock.result=acquired,pgxlock.scope=xact":                     1,
	}, sums(pgxlockotel.MetricAcquisitions))
	for _, name := range []string{pgxlockotel.MetricHeld, pgxlockotel.MetricWaiting} {
		for set, n := range sums(name) {
			require.Zero(t, n, "%s{%s}", name, set)
		}
	}
	require.Equal(t, map[string]int64{"pgxlock.namespace=oteltest": 1, "pgxlock.namespace=none": 0, "pgxlock.namespace=mixed": 0},
		sums(pgxlockotel.MetricLost))
	require.Equal(t, map[string]int64{"pgxlock.result=ok": 1, "error.type=lost,pgxlock.result=lost": 1, "error.type=_OTHER,pgxlock.result=error": 0},
		sums(pgxlockotel.MetricLeaseRenewals))
	count := func(name string) (n uint64) {
		for _, dp := range got[name].(metricdata.Histogram[float64]).DataPoints {
			n += dp.Count
		}
		return n
	}
	require.EqualValues(t, 6, count(pgxlockotel.MetricWaitDuration))
	require.EqualValues(t, 4, count(pgxlockotel.MetricHoldDuration), "3 releases and 1 loss")
	for _, name := range []string{pgxlockotel.MetricWaitDuration, pgxlockotel.MetricHoldDuration} {
		for _, sm := range rm.ScopeMetrics {
			for _, mm := range sm.Metrics {
				if mm.Name == name {
					require.Equal(t, "s", mm.Unit, name)
				}
			}
		}
	}
}

// A lock held for days (a leader) is visible while held: the acquisition
// span ends, and is exported, when the lock is acquired; the hold span, a
// sibling under the caller's span linked to it, is exported at the release.
func TestLongHoldExportsAcquisitionWhileHeld(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr, err := pgxlockotel.New(pgxlockotel.Config{TracerProvider: tp})
	require.NoError(t, err)
	l, err := advisory.New(pool, advisory.Config{Tracer: tr})
	require.NoError(t, err)

	ctx, parent := tp.Tracer("test").Start(ctx, "leader")
	h, err := l.Lock(ctx, keys.Int64(pgtest.UniqueInt64(t)), nil)
	require.NoError(t, err)
	parent.End()

	names := func() (out []string) {
		for _, s := range exp.GetSpans() {
			out = append(out, s.Name)
		}
		return out
	}
	require.Equal(t, []string{pgxlockotel.SpanAcquire, "leader"}, names(), "exported while the lock is held")
	acq := exp.GetSpans()[0]
	require.Equal(t, parent.SpanContext().SpanID(), acq.Parent.SpanID())

	require.NoError(t, h.Unlock(ctx))
	require.Equal(t, []string{pgxlockotel.SpanAcquire, "leader", pgxlockotel.SpanHold}, names())
	hold := exp.GetSpans()[2]
	require.Equal(t, parent.SpanContext().SpanID(), hold.Parent.SpanID(), "a sibling of the acquisition")
	require.Equal(t, parent.SpanContext().TraceID(), hold.SpanContext.TraceID())
	require.Len(t, hold.Links, 1)
	require.Equal(t, acq.SpanContext, hold.Links[0].SpanContext)
	require.Len(t, hold.Events, 1)
	require.Equal(t, pgxlockotel.EventReleased, hold.Events[0].Name)
}

// A hold span ends once: a loss followed by a release of the same lock (or
// the reverse) adds no second event and no second End.
func TestHoldSpanEndsOnce(t *testing.T) {
	tr, sr, _ := newTracer(t)
	start := advisory.TraceAcquireStartData{Keys: []keys.Key{keys.Int64(1)}, Scope: advisory.ScopeSession}
	ctx := tr.TraceAcquireStart(context.Background(), start)
	tr.TraceAcquireEnd(ctx, advisory.TraceAcquireEndData{TraceAcquireStartData: start, Outcome: advisory.OutcomeAcquired})
	tr.TraceLost(ctx, advisory.TraceLostData{Keys: start.Keys, Err: advisory.ErrLockLost})
	tr.TraceRelease(ctx, advisory.TraceReleaseData{Keys: start.Keys, Scope: start.Scope, Err: advisory.ErrNotHeld})

	var holds []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == pgxlockotel.SpanHold {
			holds = append(holds, s)
		}
	}
	require.Len(t, holds, 1)
	require.Equal(t, []string{pgxlockotel.EventLost}, eventNames(holds[0]))
	require.Equal(t, "lost", attrs(holds[0].Attributes())[pgxlockotel.AttrErrorType].AsString())
}

// A failed acquisition's wait is recorded with error.type; a busy try's and
// an acquisition's without.
func TestWaitDurationErrorType(t *testing.T) {
	tr, _, reader := newTracer(t)
	for _, o := range []advisory.Outcome{advisory.OutcomeAcquired, advisory.OutcomeBusy, advisory.OutcomeDeadlock, advisory.OutcomeError} {
		start := advisory.TraceAcquireStartData{Keys: []keys.Key{keys.Int64(1)}, Scope: advisory.ScopeXact}
		ctx := tr.TraceAcquireStart(context.Background(), start)
		tr.TraceAcquireEnd(ctx, advisory.TraceAcquireEndData{TraceAcquireStartData: start, Outcome: o, Waited: time.Millisecond})
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var types []string
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if mm.Name != pgxlockotel.MetricWaitDuration {
				continue
			}
			require.Equal(t, "s", mm.Unit)
			for _, dp := range mm.Data.(metricdata.Histogram[float64]).DataPoints {
				v, _ := dp.Attributes.Value(pgxlockotel.AttrErrorType)
				types = append(types, v.AsString())
			}
		}
	}
	require.ElementsMatch(t, []string{"", "deadlock", "_OTHER"}, types, "acquired and busy share the series without error.type")
}

// Review 15c: a column lease's renewal that finds its row gone
// (lease.ErrNotFound), which Do reads as the loss, was recorded as
// "error".
func TestRenewOfDeletedRowIsLost(t *testing.T) {
	tr, sr, _ := newTracer(t)
	gone := fmt.Errorf("lease: renew %q: %w", "1", lease.ErrNotFound)
	tr.TraceRenew(context.Background(), lease.TraceRenewData{Form: lease.FormColumn, Err: gone})
	tr.TraceRenew(context.Background(), lease.TraceRenewData{Form: lease.FormColumn, Err: errors.New("network")})
	spans := sr.Ended()
	require.Len(t, spans, 2)
	assert.Equal(t, "lost", attrs(spans[0].Attributes())[pgxlockotel.AttrResult].AsString())
	assert.Equal(t, "error", attrs(spans[1].Attributes())[pgxlockotel.AttrResult].AsString())
}

// New's doc: a provider that is a nil pointer is ErrInvalid, not a panic
// at first use (review 31k: New panicked).
func TestNewRefusesNilPointerProviders(t *testing.T) {
	_, err := pgxlockotel.New(pgxlockotel.Config{TracerProvider: (*sdktrace.TracerProvider)(nil)})
	require.ErrorIs(t, err, advisory.ErrInvalid)
	_, err = pgxlockotel.New(pgxlockotel.Config{MeterProvider: (*sdkmetric.MeterProvider)(nil)})
	require.ErrorIs(t, err, advisory.ErrInvalid)
}
