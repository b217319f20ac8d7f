// Package metrics exports pgxlock's lock events as Prometheus metrics.
//
// A [Collector] is an advisory tracer (install it as advisory.Config.Tracer,
// alone or in an advisory.MultiTracer), a lease tracer (lease.ColumnConfig
// and lease.ManagerConfig Tracer) and a prometheus.Collector (register it
// with a registry):
//
//	m := metrics.New(metrics.Options{})
//	prometheus.MustRegister(m)
//	locker, err := advisory.New(pool, advisory.Config{Tracer: m})
//	leases, err := lease.NewManager(pool, lease.ManagerConfig{TTL: time.Minute, Tracer: m})
//
// # Metrics
//
//	pgxlock_acquisitions_total{scope,mode,result,namespace}  counter
//	pgxlock_wait_seconds{scope,mode,namespace}               histogram (acquire start to outcome)
//	pgxlock_hold_seconds{scope,mode,namespace}               histogram (acquired to released or lost)
//	pgxlock_held{scope,mode,namespace}                       gauge (locks held now; see below)
//	pgxlock_waiting{scope,mode,namespace}                    gauge (acquisitions in progress)
//	pgxlock_lost_total{namespace}                            counter (session locks lost)
//	pgxlock_lease_renewals_total{result}                     counter (ok, lost, error)
//
// scope is "session" or "xact"; mode "exclusive" or "shared"; result one of
// advisory's outcomes (acquired, busy, timeout, deadlock, cancelled,
// no-connection, error). A lock taken in the caller's own transaction
// (advisory's LockInTx and its forms) is counted in acquisitions and wait
// but neither in held nor in hold_seconds: its end, the caller's COMMIT or
// ROLLBACK, is not an event the library sees.
//
// The counters people alert on exist at zero from registration, so that
// increase() sees their first event: pgxlock_lost_total for namespace
// "none", "mixed" and each of Options.Namespaces, and
// pgxlock_lease_renewals_total for each result. The other series appear at
// their first event.
//
// # Cardinality
//
// Labels never carry a key: keys are unbounded. namespace is the name of
// the registered keys.Namespace of the call's pair keys, "none" for bigint
// keys (plain or hashed) and "mixed" for a call whose keys span several.
// Only registered namespaces appear, so the series stay bounded by code,
// not by data. The label is looked up at each event: register namespaces
// before the process locks in them (in init, or at the start of main), or
// a lock taken before its namespace was registered is counted under "none"
// at its acquisition and under its name at its release, and pgxlock_held
// drifts by one in each.
//
// # Dashboard
//
// grafana-dashboard.json (in this directory) is a Grafana dashboard for
// these series, with the default "pgxlock" prefix: acquisitions by result
// and by scope and mode, wait and hold time quantiles (p50, p90, p99),
// held and waiting gauges, losses and lease renewals, filtered by job,
// instance and namespace variables. Import it and pick the Prometheus data source. A
// test checks that each of its queries names series this Collector
// exports, with labels they have. examples/cron --metrics-addr serves
// these metrics.
package metrics
