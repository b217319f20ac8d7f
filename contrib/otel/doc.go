// Package pgxlockotel reports pgxlock's advisory locks and lease renewals
// to OpenTelemetry: a span per acquisition, and the metrics of the
// Prometheus collector (package metrics) through the OpenTelemetry metric
// API.
//
//	tracer, err := pgxlockotel.New(pgxlockotel.Config{}) // global providers
//	locker, err := advisory.New(pool, advisory.Config{Tracer: tracer})
//	leases, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute, Tracer: tracer})
//
// # Spans
//
// Each acquisition is one span, [SpanLock] ("pgxlock.lock"), a child of the
// caller's span, from the start of the acquisition (the wait for a
// connection included). Its attributes: [AttrScope] (session, xact),
// [AttrMode] (exclusive, shared), [AttrTry], [AttrKeyCount],
// [AttrNamespace], and, at the outcome, [AttrResult] (acquired, busy,
// timeout, deadlock, cancelled, error: advisory.Outcome) and
// [AttrWaitSeconds]. An acquisition that fails ends the span there (status
// Error, except busy, which is a normal answer). An acquired lock adds the
// event [EventAcquired] and keeps the span open while held: it ends with
// the event [EventReleased] (at the unlock, or the end of the transaction)
// or [EventLost] (the holding connection died; status Error), each with
// [AttrHoldSeconds]. A lock held for days gives a span of days.
//
// A span never carries a key, the string a key was hashed from, or an
// error's text (which names keys): only the number of keys and their
// registered namespace.
//
// Each lease renewal (lease.RenewTracer), including Do's background ones,
// is a [SpanRenew] span ("pgxlock.lease.renew") covering the renewal
// statement, with [AttrLeaseForm], [AttrLeaseToken] and [AttrResult] (ok,
// lost, error). The resource name is not recorded.
//
// # Metrics
//
// The instruments are those of the Prometheus collector, with the same
// attributes (labels), so that an OpenTelemetry Prometheus exporter
// produces the same series and dashboards work on either:
//
//	OpenTelemetry instrument  kind           unit           attributes                      Prometheus (package metrics)
//	pgxlock.acquisitions      counter        {acquisition}  scope, mode, result, namespace  pgxlock_acquisitions_total
//	pgxlock.wait              histogram      s              scope, mode, namespace          pgxlock_wait_seconds
//	pgxlock.hold              histogram      s              scope, mode, namespace          pgxlock_hold_seconds
//	pgxlock.held              updowncounter  {lock}         scope, mode, namespace          pgxlock_held
//	pgxlock.waiting           updowncounter  {acquisition}  scope, mode, namespace          pgxlock_waiting
//	pgxlock.lost              counter        {lock}         namespace                       pgxlock_lost_total
//	pgxlock.lease_renewals    counter        {renewal}      result                          pgxlock_lease_renewals_total
//
// (go.opentelemetry.io/otel/exporters/prometheus, with WithoutScopeInfo,
// gives exactly the right-hand names, types and labels; a test checks it.)
//
// The histograms suggest the collector's buckets (metrics.DefaultWaitBuckets
// and metrics.DefaultHoldBuckets); a View may change them. The namespace
// attribute is the registered namespace of the call's pair keys
// (keys.Namespace.Key), "none" for other keys (plain, hashed, or
// keys.Namespace.Hash, which are single bigints), and "mixed" when a
// multi-key call spans several.
package pgxlockotel
