package lease

import (
	"context"
	"log/slog"
	"time"
)

// Form names the lease form in trace data and logs.
type Form string

// Lease forms.
const (
	FormColumn  Form = "column"
	FormManager Form = "manager"
)

// TraceRenewData describes one renewal, successful or not.
type TraceRenewData struct {
	Form     Form
	Resource string // the resource name or the row id, as given by the caller
	Token    int64  // the lease's fencing token
	Took     time.Duration
	Err      error // nil, or an error matching ErrLeaseLost, or another failure
}

// RenewTracer receives every Renew of a lease, including those Do makes in
// the background. It is called synchronously after the renewal statement
// and must be fast and safe for concurrent use. A panic in it is recovered
// and logged with the form's Logger at level Error: it neither unwinds the
// caller's Renew nor, for Do's background renewals, ends the process. The Resource is the
// caller's own value: a tracer that exports metrics must not use it as a
// label (unbounded cardinality).
type RenewTracer interface {
	TraceRenew(ctx context.Context, data TraceRenewData)
}

// observer bundles a form's optional tracer and logger.
type observer struct {
	form   Form
	tracer RenewTracer
	log    *slog.Logger
}

func newObserver(form Form, t RenewTracer, l *slog.Logger) observer {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return observer{form: form, tracer: t, log: l}
}

// renewed reports a renewal that started at start and ended with err.
func (o observer) renewed(ctx context.Context, resource string, token int64, start time.Time, err error) {
	took := time.Since(start)
	if o.tracer != nil {
		func() {
			defer func() {
				if r := recover(); r != nil {
					o.log.ErrorContext(ctx, "lease: tracer panicked; the event was dropped", "event", "TraceRenew", "panic", r, "form", o.form)
				}
			}()
			o.tracer.TraceRenew(ctx, TraceRenewData{Form: o.form, Resource: resource, Token: token, Took: took, Err: err})
		}()
	}
	level := slog.LevelDebug
	if err != nil {
		level = slog.LevelWarn
	}
	if o.log.Enabled(ctx, level) {
		attrs := []any{"form", o.form, "resource", resource, "token", token, "took", took}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		o.log.Log(ctx, level, "lease renew", attrs...)
	}
}
