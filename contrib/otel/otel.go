package pgxlockotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
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

// Span names. An acquisition is a short span that ends at its outcome, so
// it is exported at once; a lock it gave is a second span, from the
// acquisition to the release or the loss, linked to the first.
const (
	SpanAcquire = "pgxlock.acquire"     // an acquisition: start (the wait for a connection included) to outcome
	SpanHold    = "pgxlock.hold"        // an acquired lock: acquired to released or lost
	SpanRenew   = "pgxlock.lease.renew" // one lease renewal
)

// Span event names, on the hold span.
const (
	EventReleased = "pgxlock.released"
	EventLost     = "pgxlock.lost"
)

// Attribute keys of spans and metrics. Everything of pgxlock's own is under
// "pgxlock."; the OpenTelemetry semantic conventions' own names are used
// where they apply (db.system.name, error.type). Nothing carries a key or
// the string a key was hashed from: only how many keys and their registered
// namespace.
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

	// AttrDBSystemName is the semantic conventions' db.system.name,
	// "postgresql" on every span.
	AttrDBSystemName = attribute.Key("db.system.name")
	// AttrErrorType is the semantic conventions' error.type, set on spans
	// and on the acquisitions, wait duration and renewals metrics when the
	// operation failed: the advisory.Outcome of a failed acquisition
	// (timeout, deadlock, cancelled, no-connection, or _OTHER for error),
	// "lost" for a lost lock or lease, "not_held" or _OTHER for a failed
	// release, _OTHER for a failed renewal. A busy try is not a failure.
	AttrErrorType = attribute.Key("error.type")
)

// Metric instrument names.
const (
	MetricAcquisitions  = "pgxlock.acquisitions"       // counter, {acquisition}
	MetricWaitDuration  = "pgxlock.lock.wait.duration" // histogram, s
	MetricHoldDuration  = "pgxlock.lock.hold.duration" // histogram, s
	MetricHeld          = "pgxlock.held"               // updowncounter, {lock}
	MetricWaiting       = "pgxlock.waiting"            // updowncounter, {acquisition}
	MetricLost          = "pgxlock.lost"               // counter, {lock}
	MetricLeaseRenewals = "pgxlock.lease_renewals"     // counter, {renewal}
)

// errorOther is the semantic conventions' fallback value of error.type.
const errorOther = "_OTHER"

var dbSystem = AttrDBSystemName.String("postgresql")

// Config configures a Tracer. The zero value uses the global providers
// (otel.GetTracerProvider, otel.GetMeterProvider).
type Config struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Namespaces are the registered key namespaces whose pgxlock.lost
	// series New records at zero, beside "none" and "mixed" (always), as
	// metrics.Options.Namespaces does.
	Namespaces []keys.Namespace
}

// Tracer turns advisory and lease trace events into OpenTelemetry spans and
// metrics. It implements advisory.AcquireTracer, advisory.ReleaseTracer,
// advisory.LostTracer and lease.RenewTracer, and is safe for concurrent
// use. Install it as advisory.Config.Tracer (with advisory.MultiTracer
// next to another tracer; list each Tracer once: two entries of one Tracer
// share its per-call state, and one of them never ends its spans) and as
// the lease configs' Tracer.
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

// isNilPointer reports whether v, a non-nil interface, holds a nil pointer
// (or another nil value of a kind that can be nil).
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

var (
	_ advisory.AcquireTracer = (*Tracer)(nil)
	_ advisory.ReleaseTracer = (*Tracer)(nil)
	_ advisory.LostTracer    = (*Tracer)(nil)
	_ lease.RenewTracer      = (*Tracer)(nil)
)

// New returns a Tracer with its instruments created on cfg's meter. It
// returns the meter's error if an instrument cannot be created, and an
// error matching advisory.ErrInvalid for a provider that is a nil pointer
// (a typed nil in the interface, which would panic on first use).
func New(cfg Config) (*Tracer, error) {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp != nil && isNilPointer(tp) || mp != nil && isNilPointer(mp) {
		return nil, fmt.Errorf("%w: pgxlockotel: a nil pointer as TracerProvider or MeterProvider", advisory.ErrInvalid)
	}
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
	t.acquisitions, err = m.Int64Counter(MetricAcquisitions, metric.WithUnit("{acquisition}"),
		metric.WithDescription("Advisory lock acquisitions by outcome."))
	add(err)
	t.wait, err = m.Float64Histogram(MetricWaitDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an acquisition to its outcome, including the wait for a connection."),
		metric.WithExplicitBucketBoundaries(metrics.DefaultWaitBuckets...))
	add(err)
	t.hold, err = m.Float64Histogram(MetricHoldDuration, metric.WithUnit("s"),
		metric.WithDescription("Time advisory locks were held, until released or lost."),
		metric.WithExplicitBucketBoundaries(metrics.DefaultHoldBuckets...))
	add(err)
	t.held, err = m.Int64UpDownCounter(MetricHeld, metric.WithUnit("{lock}"),
		metric.WithDescription("Advisory locks held now."))
	add(err)
	t.waiting, err = m.Int64UpDownCounter(MetricWaiting, metric.WithUnit("{acquisition}"),
		metric.WithDescription("Advisory lock acquisitions in progress now."))
	add(err)
	t.lost, err = m.Int64Counter(MetricLost, metric.WithUnit("{lock}"),
		metric.WithDescription("Held session locks lost because their connection died."))
	add(err)
	t.renewals, err = m.Int64Counter(MetricLeaseRenewals, metric.WithUnit("{renewal}"),
		metric.WithDescription("Lease renewals by result: ok, lost (the lease was gone or taken over), error."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pgxlockotel: %w", err)
	}
	// The counters alerts take increase() of, at zero from the start (as
	// package metrics does), so that the first loss is an increase.
	ctx := context.Background()
	for _, ns := range []string{"none", "mixed"} {
		t.lost.Add(ctx, 0, metric.WithAttributes(AttrNamespace.String(ns)))
	}
	for _, ns := range cfg.Namespaces {
		t.lost.Add(ctx, 0, metric.WithAttributes(AttrNamespace.String(ns.Name())))
	}
	for _, r := range []string{"ok", "lost", "error"} {
		set := []attribute.KeyValue{AttrResult.String(r)}
		if r != "ok" {
			set = append(set, AttrErrorType.String(renewErrorType(r)))
		}
		t.renewals.Add(ctx, 0, metric.WithAttributes(set...))
	}
	return t, nil
}

// spanKey finds this Tracer's state in the context TraceAcquireStart
// returned, whatever other tracers of a MultiTracer put there since, other
// Tracers of this package included: the key names its Tracer (with one key
// for all, the second of two Tracers in a MultiTracer replaced the first's
// state, whose spans were then never ended: review 27).
type spanKey struct{ t *Tracer }

// lockSpans is one acquisition's spans. The context advisory passes to
// TraceAcquireEnd, TraceRelease and TraceLost is the one TraceAcquireStart
// returned, so the hold span, started at the outcome, lives here.
type lockSpans struct {
	parent  trace.SpanContext // the caller's span: the hold span's parent
	acquire trace.Span
	mu      sync.Mutex
	hold    trace.Span // nil until acquired, and again once ended
}

// TraceAcquireStart implements advisory.AcquireTracer: it starts the
// acquisition span, a child of ctx's span, and counts the acquisition as
// waiting.
func (t *Tracer) TraceAcquireStart(ctx context.Context, d advisory.TraceAcquireStartData) context.Context {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	t.waiting.Add(ctx, 1, metric.WithAttributeSet(lockSet(scope, mode, ns)))
	st := &lockSpans{parent: trace.SpanContextFromContext(ctx)}
	ctx, st.acquire = t.tracer.Start(ctx, SpanAcquire, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		dbSystem, AttrScope.String(scope), AttrMode.String(mode), AttrTry.Bool(d.Try),
		AttrKeyCount.Int(len(d.Keys)), AttrNamespace.String(ns)))
	return context.WithValue(ctx, spanKey{t}, st)
}

// TraceAcquireEnd implements advisory.AcquireTracer: it records the result
// and wait and ends the acquisition span, which an exporter then sends at
// once, while the lock is held. Timeouts, deadlocks, cancellations and
// errors set its status to Error and error.type; busy does not. An acquired
// lock starts the hold span: a child of the caller's span (a sibling of the
// acquisition span; a child of the acquisition span when the caller had
// none) with a link to the acquisition span and the same attributes, ended
// at the release or the loss.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, d advisory.TraceAcquireEndData) {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.waiting.Add(ctx, -1, metric.WithAttributeSet(set))
	errType := acquireErrorType(d.Outcome)
	result := []attribute.KeyValue{AttrScope.String(scope), AttrMode.String(mode),
		AttrResult.String(string(d.Outcome)), AttrNamespace.String(ns)}
	waitAttrs := set.ToSlice()
	if errType != "" {
		result = append(result, AttrErrorType.String(errType))
		waitAttrs = append(waitAttrs, AttrErrorType.String(errType))
	}
	t.acquisitions.Add(ctx, 1, metric.WithAttributes(result...))
	t.wait.Record(ctx, d.Waited.Seconds(), metric.WithAttributes(waitAttrs...))
	if d.Outcome == advisory.OutcomeAcquired && !d.CallerTx { // no release event follows a lock in the caller's transaction
		t.held.Add(ctx, 1, metric.WithAttributeSet(set))
	}

	st := t.stateOf(ctx)
	if st == nil {
		return
	}
	span := st.acquire
	span.SetAttributes(AttrResult.String(string(d.Outcome)), AttrWaitSeconds.Float64(d.Waited.Seconds()))
	if errType != "" {
		// The outcome, not err.Error(): the error text names the keys.
		span.SetAttributes(AttrErrorType.String(errType))
		span.SetStatus(codes.Error, string(d.Outcome))
	}
	span.End()
	if d.Outcome != advisory.OutcomeAcquired || d.CallerTx {
		return // no hold span: a lock in the caller's transaction has no release event
	}
	parent := st.parent
	if !parent.IsValid() {
		parent = span.SpanContext() // no caller's span: the hold joins the acquisition's trace
	}
	_, hold := t.tracer.Start(trace.ContextWithSpanContext(ctx, parent), SpanHold,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(trace.Link{SpanContext: span.SpanContext()}),
		trace.WithAttributes(dbSystem, AttrScope.String(scope), AttrMode.String(mode),
			AttrKeyCount.Int(len(d.Keys)), AttrNamespace.String(ns)))
	st.mu.Lock()
	st.hold = hold
	st.mu.Unlock()
}

// endHold returns the hold span of ctx's acquisition for the one event
// that ends it (nil if there is none, or it has ended).
func (t *Tracer) endHold(ctx context.Context) trace.Span {
	st := t.stateOf(ctx)
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	h := st.hold
	st.hold = nil
	return h
}

// TraceRelease implements advisory.ReleaseTracer: a release event with the
// hold time, then the hold span ends (status Error if the unlock failed).
func (t *Tracer) TraceRelease(ctx context.Context, d advisory.TraceReleaseData) {
	scope, mode, ns := string(d.Scope), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.held.Add(ctx, -1, metric.WithAttributeSet(set))
	t.hold.Record(ctx, d.Held.Seconds(), metric.WithAttributeSet(set))

	span := t.endHold(ctx)
	if span == nil {
		return
	}
	span.AddEvent(EventReleased, trace.WithAttributes(AttrHoldSeconds.Float64(d.Held.Seconds())))
	if d.Err != nil {
		et := errorOther
		if errors.Is(d.Err, advisory.ErrNotHeld) {
			et = "not_held"
		}
		span.SetAttributes(AttrErrorType.String(et))
		span.SetStatus(codes.Error, "release failed")
	}
	span.End()
}

// TraceLost implements advisory.LostTracer: a loss event with the hold
// time, status Error "lost", error.type "lost", and the hold span ends.
func (t *Tracer) TraceLost(ctx context.Context, d advisory.TraceLostData) {
	scope, mode, ns := string(advisory.ScopeSession), modeOf(d.Shared), keys.NamespaceLabel(d.Keys)
	set := lockSet(scope, mode, ns)
	t.held.Add(ctx, -1, metric.WithAttributeSet(set))
	t.hold.Record(ctx, d.Held.Seconds(), metric.WithAttributeSet(set))
	t.lost.Add(ctx, 1, metric.WithAttributes(AttrNamespace.String(ns)))

	span := t.endHold(ctx)
	if span == nil {
		return
	}
	span.AddEvent(EventLost, trace.WithAttributes(AttrHoldSeconds.Float64(d.Held.Seconds())))
	span.SetAttributes(AttrErrorType.String("lost"))
	span.SetStatus(codes.Error, "lost")
	span.End()
}

// acquireErrorType is error.type for an acquisition's outcome: "" when it
// did not fail (acquired, busy).
func acquireErrorType(o advisory.Outcome) string {
	switch o {
	case advisory.OutcomeAcquired, advisory.OutcomeBusy:
		return ""
	case advisory.OutcomeTimeout, advisory.OutcomeDeadlock, advisory.OutcomeCancelled, advisory.OutcomeNoConnection:
		return string(o)
	}
	return errorOther
}

func renewErrorType(result string) string {
	if result == "lost" {
		return "lost"
	}
	return errorOther
}

// TraceRenew implements lease.RenewTracer: a pgxlock.lease.renew span
// covering the renewal (child of ctx's span) and the lease_renewals
// counter, result "ok", "lost" (lease.ErrLeaseLost, or lease.ErrNotFound:
// a column lease's row is gone, which Do reads as the loss too) or
// "error". The resource name is not recorded.
func (t *Tracer) TraceRenew(ctx context.Context, d lease.TraceRenewData) {
	result := "ok"
	switch {
	case d.Err == nil:
	case errors.Is(d.Err, lease.ErrLeaseLost), errors.Is(d.Err, lease.ErrNotFound):
		result = "lost"
	default:
		result = "error"
	}
	ra := []attribute.KeyValue{AttrResult.String(result)}
	if result != "ok" {
		ra = append(ra, AttrErrorType.String(renewErrorType(result)))
	}
	t.renewals.Add(ctx, 1, metric.WithAttributes(ra...))
	end := time.Now()
	_, span := t.tracer.Start(ctx, SpanRenew, trace.WithTimestamp(end.Add(-d.Took)), trace.WithAttributes(
		dbSystem, AttrLeaseForm.String(string(d.Form)), AttrLeaseToken.Int64(d.Token), AttrResult.String(result)))
	if result != "ok" {
		span.SetAttributes(AttrErrorType.String(renewErrorType(result)))
		span.SetStatus(codes.Error, result)
	}
	span.End(trace.WithTimestamp(end))
}

// stateOf returns the spans TraceAcquireStart put in ctx (nil if none).
func (t *Tracer) stateOf(ctx context.Context) *lockSpans {
	st, _ := ctx.Value(spanKey{t}).(*lockSpans)
	return st
}

func lockSet(scope, mode, ns string) attribute.Set {
	return attribute.NewSet(AttrScope.String(scope), AttrMode.String(mode), AttrNamespace.String(ns))
}

func modeOf(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusive"
}
