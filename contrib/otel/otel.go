package pgxlockotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
	"github.com/pgxlock/pgxlock/metrics"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/pgxlock/pgxlock/contrib/otel"

// Span names.
const (
	SpanLock  = "pgxlock.lock"        // an acquisition and, once acquired, the hold
	SpanRenew = "pgxlock.lease.renew" // one lease renewal
)

// Span event names.
const (
	EventAcquired = "pgxlock.acquired"
	EventReleased = "pgxlock.released"
	EventLost     = "pgxlock.lost"
)

// Span attribute keys. A span never carries a key or the string a key was
// hashed from: only how many keys and their registered namespace.
const (
	AttrScope       = attribute.Key("pgxlock.scope")        // "session" or "xact"
	AttrMode        = attribute.Key("pgxlock.mode")         // "exclusive" or "shared"
	AttrTry         = attribute.Key("pgxlock.try")          // true: the call did not wait
	AttrKeyCount    = attribute.Key("pgxlock.key_count")    // distinct keys of the call
	AttrNamespace   = attribute.Key("pgxlock.namespace")    // see the package documentation
	AttrResult      = attribute.Key("pgxlock.result")       // advisory.Outcome, or a renewal's ok/lost/error
	AttrWaitSeconds = attribute.Key("pgxlock.wait_seconds") // start of the acquisition to its outcome
	AttrHoldSeconds = attribute.Key("pgxlock.hold_seconds") // on the release and loss events
	AttrLeaseForm   = attribute.Key("pgxlock.lease.form")   // "column" or "manager"
	AttrLeaseToken  = attribute.Key("pgxlock.lease.token")  // the lease's fencing token
)

// Config configures a Tracer. The zero value uses the global providers
// (otel.GetTracerProvider, otel.GetMeterProvider).
type Config struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Tracer turns advisory and lease trace events into OpenTelemetry spans and
// metrics. It implements advisory.AcquireTracer, advisory.ReleaseTracer,
// advisory.LostTracer and lease.RenewTracer, and is safe for concurrent
// use. Install it as advisory.Config.Tracer (with advisory.MultiTracer
// next to another tracer) and as the lease configs' Tracer.
type Tracer struct {
	tracer trace.Tracer

	acquisitions metric.Int64Counter
	wait         metric.Float64Histogram
	hold         metric.Float64Histogram
	held         metric.Int64UpDownCounter
	waiting      metric.Int64UpDownCounter
	lost         metric.Int64Counter
	renewals     metric.Int64Counter
}

var (
	_ advisory.AcquireTracer = (*Tracer)(nil)
	_ advisory.ReleaseTracer = (*Tracer)(nil)
	_ advisory.LostTracer    = (*Tracer)(nil)
	_ lease.RenewTracer      = (*Tracer)(nil)
)

// New returns a Tracer with its instruments created on cfg's meter. It
// returns the meter's error if an instrument cannot be created.
func New(cfg Config) (*Tracer, error) {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	t := &Tracer{tracer: tp.Tracer(ScopeName)}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	t.acquisitions, err = m.Int64Counter("pgxlock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Advisory lock acquisitions by outcome."))
	add(err)
	t.wait, err = m.Float64Histogram("pgxlock.wait", metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an acquisition to its outcome, including the wait for a connection."),
		metric.WithExplicitBucketBoundaries(metrics.DefaultWaitBuckets...))
	add(err)
	t.hold, err = m.Float64Histogram("pgxlock.hold", metric.WithUnit("s"),
		metric.WithDescription("Time advisory locks were held, until released or lost."),
		metric.WithExplicitBucketBoundaries(metrics.DefaultHoldBuckets...))
	add(err)
	t.held, err = m.Int64UpDownCounter("pgxlock.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Advisory locks held now."))
	add(err)
	t.waiting, err = m.Int64UpDownCounter("pgxlock.waiting", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Advisory lock acquisitions in progress now."))
	add(err)
	t.lost, err = m.Int64Counter("pgxlock.lost", metric.WithUnit("{lock}"),
		metric.WithDescription("Held session locks lost because their connection died."))
	add(err)
	t.renewals, err = m.Int64Counter("pgxlock.lease_renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Lease renewals by result: ok, lost (the lease was gone or taken over), error."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pgxlockotel: %w", err)
	}
	return t, nil
}

// spanKey finds this Tracer's span in the context TraceAcquireStart
// returned, whatever other tracers of a MultiTracer put there since.
type spanKey struct{}

// TraceAcquireStart implements advisory.AcquireTracer: it starts the lock
// span, a child of ctx's span, and counts the acquisition as waiting.
func (t *Tracer) TraceAcquireStart(ctx context.Context, d advisory.TraceAcquireStartData) context.Context {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	t.waiting.Add(ctx, 1, metric.WithAttributeSet(lockSet(scope, mode, ns)))
	ctx, span := t.tracer.Start(ctx, SpanLock, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		AttrScope.String(scope), AttrMode.String(mode), AttrTry.Bool(d.Try),
		AttrKeyCount.Int(len(d.Keys)), AttrNamespace.String(ns)))
	return context.WithValue(ctx, spanKey{}, span)
}

// TraceAcquireEnd implements advisory.AcquireTracer: it records the result
// and wait, and ends the span unless the lock was acquired (the span then
// lasts until the release or the loss). Timeouts, deadlocks, cancellations
// and errors set the span's status to Error; busy does not.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, d advisory.TraceAcquireEndData) {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.waiting.Add(ctx, -1, metric.WithAttributeSet(set))
	t.acquisitions.Add(ctx, 1, metric.WithAttributes(
		attribute.String("scope", scope), attribute.String("mode", mode),
		attribute.String("result", string(d.Outcome)), attribute.String("namespace", ns)))
	t.wait.Record(ctx, d.Waited.Seconds(), metric.WithAttributeSet(set))
	if d.Outcome == advisory.OutcomeAcquired {
		t.held.Add(ctx, 1, metric.WithAttributeSet(set))
	}

	span := spanOf(ctx)
	span.SetAttributes(AttrResult.String(string(d.Outcome)), AttrWaitSeconds.Float64(d.Waited.Seconds()))
	switch d.Outcome {
	case advisory.OutcomeAcquired:
		span.AddEvent(EventAcquired)
		return
	case advisory.OutcomeBusy:
	default:
		// The outcome, not err.Error(): the error text names the keys.
		span.SetStatus(codes.Error, string(d.Outcome))
	}
	span.End()
}

// TraceRelease implements advisory.ReleaseTracer: a release event with the
// hold time, then the span ends (status Error if the unlock failed).
func (t *Tracer) TraceRelease(ctx context.Context, d advisory.TraceReleaseData) {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.held.Add(ctx, -1, metric.WithAttributeSet(set))
	t.hold.Record(ctx, d.Held.Seconds(), metric.WithAttributeSet(set))

	span := spanOf(ctx)
	span.AddEvent(EventReleased, trace.WithAttributes(AttrHoldSeconds.Float64(d.Held.Seconds())))
	if d.Err != nil {
		span.SetStatus(codes.Error, "release failed")
	}
	span.End()
}

// TraceLost implements advisory.LostTracer: a loss event with the hold
// time, status Error "lost", and the span ends.
func (t *Tracer) TraceLost(ctx context.Context, d advisory.TraceLostData) {
	scope, mode, ns := string(advisory.ScopeSession), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.held.Add(ctx, -1, metric.WithAttributeSet(set))
	t.hold.Record(ctx, d.Held.Seconds(), metric.WithAttributeSet(set))
	t.lost.Add(ctx, 1, metric.WithAttributes(attribute.String("namespace", ns)))

	span := spanOf(ctx)
	span.AddEvent(EventLost, trace.WithAttributes(AttrHoldSeconds.Float64(d.Held.Seconds())))
	span.SetStatus(codes.Error, "lost")
	span.End()
}

// TraceRenew implements lease.RenewTracer: a pgxlock.lease.renew span
// covering the renewal (child of ctx's span) and the lease_renewals
// counter, result "ok", "lost" (lease.ErrLeaseLost) or "error". The
// resource name is not recorded.
func (t *Tracer) TraceRenew(ctx context.Context, d lease.TraceRenewData) {
	result := "ok"
	switch {
	case d.Err == nil:
	case errors.Is(d.Err, lease.ErrLeaseLost):
		result = "lost"
	default:
		result = "error"
	}
	t.renewals.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
	end := time.Now()
	_, span := t.tracer.Start(ctx, SpanRenew, trace.WithTimestamp(end.Add(-d.Took)), trace.WithAttributes(
		AttrLeaseForm.String(string(d.Form)), AttrLeaseToken.Int64(d.Token), AttrResult.String(result)))
	if result != "ok" {
		span.SetStatus(codes.Error, result)
	}
	span.End(trace.WithTimestamp(end))
}

// spanOf returns the span TraceAcquireStart put in ctx (a no-op span if
// none).
func spanOf(ctx context.Context) trace.Span {
	if s, ok := ctx.Value(spanKey{}).(trace.Span); ok {
		return s
	}
	return trace.SpanFromContext(ctx)
}

func lockSet(scope, mode, ns string) attribute.Set {
	return attribute.NewSet(attribute.String("scope", scope), attribute.String("mode", mode), attribute.String("namespace", ns))
}

func modeOf(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusive"
}
