package metrics

import (
	"context"
	"errors"
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
)

// Options configure a Collector. The zero value is ready to use.
type Options struct {
	// Namespace prefixes every metric name ("" = "pgxlock").
	Namespace string
	// WaitBuckets and HoldBuckets are histogram buckets in seconds; nil
	// means DefaultWaitBuckets and DefaultHoldBuckets. They are used
	// sorted, without duplicates, NaN or +Inf (Prometheus adds +Inf
	// itself): Prometheus refuses them otherwise, and would do so inside a
	// lock call, at the first observation. A list left empty by that means
	// the default.
	WaitBuckets, HoldBuckets []float64
	// ConstLabels are added to every series (e.g. the service name).
	ConstLabels prometheus.Labels
	// Namespaces are the registered key namespaces whose pgxlock_lost_total
	// series New creates at zero, beside "none" and "mixed" (always). A
	// counter series that first appears with value 1 is invisible to
	// increase() and rate(), so an alert on the first loss needs the series
	// to exist before it: list the namespaces the process locks in.
	Namespaces []keys.Namespace
}

// Default histogram buckets: waits from 100 µs (an uncontended round trip)
// to a minute; holds from a millisecond to an hour.
var (
	DefaultWaitBuckets = []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60}
	DefaultHoldBuckets = []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}
)

// Collector turns advisory and lease trace events into Prometheus metrics. It implements
// advisory.AcquireTracer, advisory.ReleaseTracer, advisory.LostTracer and
// prometheus.Collector, and is safe for concurrent use.
type Collector struct {
	acquisitions *prometheus.CounterVec
	wait         *prometheus.HistogramVec
	hold         *prometheus.HistogramVec
	held         *prometheus.GaugeVec
	waiting      *prometheus.GaugeVec
	lost         *prometheus.CounterVec
	renewals     *prometheus.CounterVec
}

var (
	_ advisory.AcquireTracer = (*Collector)(nil)
	_ advisory.ReleaseTracer = (*Collector)(nil)
	_ advisory.LostTracer    = (*Collector)(nil)
	_ lease.RenewTracer      = (*Collector)(nil)
	_ prometheus.Collector   = (*Collector)(nil)
)

// New returns a Collector; register it with a prometheus.Registerer.
func New(opts Options) *Collector {
	ns := opts.Namespace
	if ns == "" {
		ns = "pgxlock"
	}
	wb, hb := buckets(opts.WaitBuckets, DefaultWaitBuckets), buckets(opts.HoldBuckets, DefaultHoldBuckets)
	cl := opts.ConstLabels
	lockLabels := []string{"scope", "mode", "namespace"}
	c := &Collector{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "acquisitions_total", ConstLabels: cl,
			Help: "Advisory lock acquisitions by outcome."}, []string{"scope", "mode", "result", "namespace"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "wait_seconds", ConstLabels: cl, Buckets: wb,
			Help: "Time from the start of an acquisition to its outcome, including the wait for a connection."}, lockLabels),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "hold_seconds", ConstLabels: cl, Buckets: hb,
			Help: "Time advisory locks were held, until released or lost."}, lockLabels),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "held", ConstLabels: cl,
			Help: "Advisory locks held now."}, lockLabels),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "waiting", ConstLabels: cl,
			Help: "Advisory lock acquisitions in progress now."}, lockLabels),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lost_total", ConstLabels: cl,
			Help: "Held session locks lost because their connection died."}, []string{"namespace"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lease_renewals_total", ConstLabels: cl,
			Help: "Lease renewals by result: ok, lost (the lease was gone or taken over), error."}, []string{"result"}),
	}
	// The series alerts count with increase(): present at zero from the
	// first scrape, so that the first loss or failed renewal is an increase.
	for _, ns := range []string{"none", "mixed"} {
		c.lost.WithLabelValues(ns)
	}
	for _, ns := range opts.Namespaces {
		c.lost.WithLabelValues(ns.Name())
	}
	for _, r := range []string{"ok", "lost", "error"} {
		c.renewals.WithLabelValues(r)
	}
	return c
}

func (c *Collector) all() []prometheus.Collector {
	return []prometheus.Collector{c.acquisitions, c.wait, c.hold, c.held, c.waiting, c.lost, c.renewals}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.all() {
		m.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.all() {
		m.Collect(ch)
	}
}

// TraceAcquireStart implements advisory.AcquireTracer.
func (c *Collector) TraceAcquireStart(ctx context.Context, d advisory.TraceAcquireStartData) context.Context {
	c.waiting.WithLabelValues(string(d.Scope), mode(d.Shared), keys.NamespaceLabel(d.Keys)).Inc()
	return ctx
}

// TraceAcquireEnd implements advisory.AcquireTracer.
func (c *Collector) TraceAcquireEnd(_ context.Context, d advisory.TraceAcquireEndData) {
	scope, m, ns := string(d.Scope), mode(d.Shared), keys.NamespaceLabel(d.Keys)
	c.waiting.WithLabelValues(scope, m, ns).Dec()
	c.acquisitions.WithLabelValues(scope, m, string(d.Outcome), ns).Inc()
	c.wait.WithLabelValues(scope, m, ns).Observe(d.Waited.Seconds())
	if d.Outcome == advisory.OutcomeAcquired && !d.CallerTx { // a lock in the caller's transaction has no release event
		c.held.WithLabelValues(scope, m, ns).Inc()
	}
}

// TraceRelease implements advisory.ReleaseTracer.
func (c *Collector) TraceRelease(_ context.Context, d advisory.TraceReleaseData) {
	scope, m, ns := string(d.Scope), mode(d.Shared), keys.NamespaceLabel(d.Keys)
	c.held.WithLabelValues(scope, m, ns).Dec()
	c.hold.WithLabelValues(scope, m, ns).Observe(d.Held.Seconds())
}

// TraceRenew implements lease.RenewTracer: result "ok", "lost" (the lease
// had expired or was taken over: ErrLeaseLost; or a column lease's row is
// gone: ErrNotFound, which Do reads as the loss too) or "error".
func (c *Collector) TraceRenew(_ context.Context, d lease.TraceRenewData) {
	switch {
	case d.Err == nil:
		c.renewals.WithLabelValues("ok").Inc()
	case errors.Is(d.Err, lease.ErrLeaseLost), errors.Is(d.Err, lease.ErrNotFound):
		c.renewals.WithLabelValues("lost").Inc()
	default:
		c.renewals.WithLabelValues("error").Inc()
	}
}

// TraceLost implements advisory.LostTracer.
func (c *Collector) TraceLost(_ context.Context, d advisory.TraceLostData) {
	scope, m, ns := string(advisory.ScopeSession), mode(d.Shared), keys.NamespaceLabel(d.Keys)
	c.held.WithLabelValues(scope, m, ns).Dec()
	c.hold.WithLabelValues(scope, m, ns).Observe(d.Held.Seconds())
	c.lost.WithLabelValues(ns).Inc()
}

// buckets returns b sorted and without duplicates, NaN or +Inf, or def
// when nothing is left.
func buckets(b, def []float64) []float64 {
	out := make([]float64, 0, len(b))
	for _, v := range b {
		if !math.IsNaN(v) && !math.IsInf(v, 1) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return def
	}
	return out
}

func mode(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusive"
}
