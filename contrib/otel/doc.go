// Package pgxlockotel reports pgxlock's advisory locks and lease renewals
// to OpenTelemetry: a span per acquisition and one per lock held, and the
// metrics of the Prometheus collector (package metrics) through the
// OpenTelemetry metric API.
//
//	tracer, err := pgxlockotel.New(pgxlockotel.Config{}) // global providers
//	locker, err := advisory.New(pool, advisory.Config{Tracer: tracer})
//	leases, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute, Tracer: tracer})
//
// # Spans
//
// Each acquisition is a short span, [SpanAcquire] ("pgxlock.acquire"), a
// child of the caller's span, from the start of the acquisition (the wait
// for a connection included) to its outcome, where it ends: an exporter
// sends it as soon as the lock is taken (or not), so a lock held for days,
// by a leader, is visible from the start. Its attributes: [AttrDBSystemName]
// ("postgresql"), [AttrScope] (session, xact), [AttrMode] (exclusive,
// shared), [AttrTry], [AttrKeyCount], [AttrNamespace], and, at the outcome,
// [AttrResult] (acquired, busy, timeout, deadlock, cancelled,
// no-connection, error: advisory.Outcome) and [AttrWaitSeconds]. A failed
// acquisition has status Error and [AttrErrorType] (error.type: the
// outcome, _OTHER for error); busy is a normal answer, not a failure.
//
// Each lock acquired is a second span, [SpanHold] ("pgxlock.hold"), from
// the acquisition to the release (event [EventReleased], at the unlock or
// the end of the transaction) or the loss (event [EventLost], the holding
// connection died; status Error, error.type "lost"), each event with
// [AttrHoldSeconds]. It is a sibling of the acquisition span, under the
// caller's span (under the acquisition span when the caller had none),
// carries the same db.system.name, scope, mode, key count and namespace,
// and links to the acquisition span. Like every span it is exported when it
// ends: for a long hold, the acquisition span is what shows the lock
// meanwhile, and the pgxlock.held metric counts it. A lock taken in the
// caller's own transaction (advisory's LockInTx and its forms:
// advisory.TraceAcquireStartData.CallerTx) has the acquisition span only,
// and pgxlock.held does not count it: its end, the caller's COMMIT or
// ROLLBACK, is not an event the library sees.
//
// Namespace attributes are looked up at each event, as in package metrics:
// register namespaces before the process locks in them, or pgxlock.held
// drifts for a lock taken before its namespace was registered.
//
// A span never carries a key, the string a key was hashed from, or an
// error's text (which names keys): only the number of keys and their
// registered namespace.
//
// Each lease renewal (lease.RenewTracer), including Do's background ones,
// is a [SpanRenew] span ("pgxlock.lease.renew") covering the renewal
// statement, with db.system.name, [AttrLeaseForm], [AttrLeaseToken] and
// [AttrResult] (ok, lost, error; error.type "lost" or _OTHER on failure).
// The resource name is not recorded.
//
// # Metrics
//
// The instruments are those of the Prometheus collector (package metrics),
// named after the semantic conventions where they have a rule (durations
// are histograms named *.duration, in seconds, "s"), with the attributes
// under the same pgxlock. prefix as the spans', and error.type on failed
// acquisitions, waits and renewals:
//
//	OpenTelemetry instrument    kind           unit           attributes (pgxlock.*)          Prometheus (package metrics)
//	pgxlock.acquisitions        counter        {acquisition}  scope, mode, result, namespace  pgxlock_acquisitions_total
//	pgxlock.lock.wait.duration  histogram      s              scope, mode, namespace          pgxlock_wait_seconds
//	pgxlock.lock.hold.duration  histogram      s              scope, mode, namespace          pgxlock_hold_seconds
//	pgxlock.held                updowncounter  {lock}         scope, mode, namespace          pgxlock_held
//	pgxlock.waiting             updowncounter  {acquisition}  scope, mode, namespace          pgxlock_waiting
//	pgxlock.lost                counter        {lock}         namespace                       pgxlock_lost_total
//	pgxlock.lease_renewals      counter        {renewal}      result                          pgxlock_lease_renewals_total
//
// Through go.opentelemetry.io/otel/exporters/prometheus (WithoutScopeInfo)
// they become the right-hand families and types, except the two histograms
// (pgxlock_lock_wait_duration_seconds, pgxlock_lock_hold_duration_seconds),
// with labels pgxlock_scope, pgxlock_mode, ... and error_type; a test
// checks it. metrics/grafana-dashboard.json is for package metrics' names.
// pgxlock.lost ("none", "mixed" and Config.Namespaces) and
// pgxlock.lease_renewals (each result) are recorded at zero by New, so that
// the first loss is an increase.
//
// The histograms suggest the collector's buckets (metrics.DefaultWaitBuckets
// and metrics.DefaultHoldBuckets); a View may change them. The namespace
// attribute is the registered namespace of the call's pair keys
// (keys.Namespace.Key), "none" for other keys (plain, hashed, or
// keys.Namespace.Hash, which are single bigints), and "mixed" when a
// multi-key call spans several.
package pgxlockotel
