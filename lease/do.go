package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DoOptions are per-call settings for Do and TryDo; a nil pointer means all
// defaults.
type DoOptions struct {
	// Acquire holds the acquisition options of Manager.Do and Manager.TryDo
	// (mode, TTL, owner, metadata). Column leases take their TTL from
	// ColumnConfig and ignore it.
	Acquire *AcquireOptions
	// RenewEvery is the interval between renewals. Default TTL/3. It must be
	// shorter than TTL-Margin, or the trust window would close before the
	// first renewal.
	RenewEvery time.Duration
	// Margin is how long before the TTL runs out, counted from the start of
	// the last successful acquisition or renewal statement, the callback
	// stops being trusted. It covers the time the callback needs to notice
	// cancellation and stop, and any drift between the local and database
	// clock rates. Default TTL/10.
	Margin time.Duration
}

// Do acquires the lease (waiting as Acquire does), runs fn, and releases.
//
// While fn runs, a goroutine renews the lease every RenewEvery. fn's context
// is cancelled with a cause wrapping ErrLeaseLost (see context.Cause) as soon
// as a renewal reports the lease lost, or when the trust window closes: the
// start of the winning acquisition (or of the last successful renewal)
// plus TTL minus Margin, measured on the local monotonic clock. The window
// only ever makes the callback stop early; no lease decision uses it.
// Transient renewal errors are retried until the window closes. A renewal
// that panics (code of the pool's, a tracer or an OnNotice handler, run on
// the renewal goroutine) stops the renewals and cancels fn's context the
// same way, and its panic is raised again in Do's caller once fn has
// returned and the lease is released (a panic value that is an error is in
// the cause's chain); one that calls runtime.Goexit there stops them too,
// and Do reports the lease lost.
//
// ctx governs the acquisition and is the parent of fn's context. The renewal
// goroutine is stopped and waited for before the release, which runs under
// context.WithoutCancel(ctx) bounded by ReleaseTimeout (the ROLLBACK of a
// release statement that failed included), also when fn panics
// (the panic then continues). A release that fails on the connection rather
// than in the database (a pooled connection found dead after the work) is
// retried within that bound on another connection, one that has just
// answered a ping (however many dead ones the pool holds). Do returns nil, or an
// [*Error] (Op "do", the resource) wrapping fn's error, joined with the loss
// (wrapping ErrLeaseLost, even if fn returned nil: its work was not
// protected to the end) and with a release failure (wrapping ErrNotReleased
// and its cause: the lease may stay held until its TTL). errors.Is finds
// fn's error in it, and its text is fn's error's text unedited.
func (m *Manager) Do(ctx context.Context, resource string, opts *DoOptions, fn func(ctx context.Context, l *Lease) error) error {
	return m.do(ctx, "do", resource, opts, m.Acquire, fn)
}

// TryDo is Do with a single acquisition attempt: it returns ErrNotAcquired
// at once if the lease is held.
func (m *Manager) TryDo(ctx context.Context, resource string, opts *DoOptions, fn func(ctx context.Context, l *Lease) error) error {
	return m.do(ctx, "try do", resource, opts, m.TryAcquire, fn)
}

type acquireFunc func(context.Context, string, *AcquireOptions) (*Lease, error)

func (m *Manager) do(ctx context.Context, op, resource string, opts *DoOptions, acquire acquireFunc, fn func(context.Context, *Lease) error) error {
	var acq *AcquireOptions
	if opts != nil {
		acq = opts.Acquire
	}
	ttl := m.ttl
	if acq != nil && acq.TTL != 0 {
		ttl = acq.TTL
	}
	s, err := newSchedule(op, resource, ttl, opts)
	if err != nil {
		return err
	}
	l, err := acquire(ctx, resource, acq)
	if err != nil {
		return err
	}
	return run(ctx, op, l.keepAlive(), s, func(ctx context.Context) error { return fn(ctx, l) })
}

// TryDo claims the row (as TryAcquire), runs fn, and releases, renewing in
// the background exactly as Manager.Do does. It returns ErrNotAcquired or
// ErrNotFound at once if the row cannot be claimed.
func (c *Column) TryDo(ctx context.Context, id any, opts *DoOptions, fn func(ctx context.Context, l *ColumnLease) error) error {
	s, err := newSchedule("try do", resourceOf(id), c.ttl, opts)
	if err != nil {
		return err
	}
	l, err := c.TryAcquire(ctx, id)
	if err != nil {
		return err
	}
	return run(ctx, "try do", l.keepAlive(), s, func(ctx context.Context) error { return fn(ctx, l) })
}

// schedule is a validated renewal plan.
type schedule struct{ every, margin time.Duration }

func newSchedule(op, resource string, ttl time.Duration, o *DoOptions) (schedule, error) {
	if o == nil {
		o = &DoOptions{}
	}
	s := schedule{every: o.RenewEvery, margin: o.Margin}
	if err := checkTTL(ttl); err != nil {
		return s, opError(op, resource, err)
	}
	if s.every == 0 {
		s.every = ttl / 3
	}
	if s.margin == 0 {
		s.margin = ttl / 10
	}
	switch {
	case s.every < 0 || s.margin < 0:
		return s, opError(op, resource, fmt.Errorf("%w: negative renew interval or margin", ErrInvalid))
	case s.every >= ttl || s.margin >= ttl || s.every >= ttl-s.margin: // every+margin >= ttl, without the sum's overflow
		return s, opError(op, resource, fmt.Errorf("%w: renew interval %v plus margin %v must be shorter than the TTL %v", ErrInvalid, s.every, s.margin, ttl))
	}
	return s, nil
}

// keepAlive is what the Do machinery needs from either lease form.
type keepAlive struct {
	resource string
	ttl      time.Duration
	started  time.Time // local monotonic start of the winning acquisition statement
	renew    func(context.Context) error
	release  func(context.Context) error
	timeout  time.Duration // release bound
}

// run is the body shared by every Do form: keeper goroutine, callback,
// ordered shutdown, bounded release, error assembly. A non-nil result is an
// *Error named op, so that errors.As finds one even when fn's own error is
// the only cause.
func run(ctx context.Context, op string, k keepAlive, s schedule, fn func(context.Context) error) error {
	fctx, cancelFn := context.WithCancelCause(ctx)
	defer cancelFn(nil)
	kctx, stopKeeper := context.WithCancel(ctx)
	defer stopKeeper()

	var lost error // set by the keeper; read only after wg.Wait
	var kept keeperPanic
	var wg sync.WaitGroup
	wg.Go(func() {
		// The keeper's goroutine is the library's: a panic of the pool's
		// code in a renewal (a tracer, an OnNotice handler) would end the
		// process there. It stops the trust in the lease (fn's context is
		// cancelled) and is raised again in the caller's goroutine once fn
		// has returned and the lease is released.
		defer kept.catch(cancelFn)
		lost = k.keep(kctx, s, cancelFn)
		kept.done = true
	})

	finish := func() error {
		stopKeeper() // also interrupts a renewal in flight
		wg.Wait()
		rctx, cancel := cleanupContext(ctx, k.timeout)
		defer cancel()
		return releaseRetrying(rctx, k.release)
	}
	panicked := true
	defer func() {
		if panicked { // release, then let the panic continue
			_ = finish()
		}
	}()
	fnErr := fn(fctx)
	panicked = false
	relErr := finish()
	if kept.panicked {
		panic(kept.value)
	}
	if !kept.done {
		lost = kept.cause // the keeper exited its goroutine: the renewals stopped
	}

	var errs []error
	if fnErr != nil {
		errs = append(errs, fnErr)
	}
	if lost != nil && !errors.Is(fnErr, ErrLeaseLost) {
		errs = append(errs, lost)
	}
	// A column lease whose row is gone (ErrNotFound) is lost too, as the
	// keeper reads it: nothing is left to hold until a TTL.
	gone := errors.Is(relErr, ErrLeaseLost) || errors.Is(relErr, ErrNotFound)
	switch {
	case relErr == nil, lost != nil && gone:
	case gone: // lost unnoticed: the work was not protected to the end
		if !errors.Is(relErr, ErrLeaseLost) {
			relErr = errors.Join(ErrLeaseLost, relErr)
		}
		errs = append(errs, relErr)
	default: // the lease may still be held, until its TTL
		errs = append(errs, fmt.Errorf("%w: %w", ErrNotReleased, relErr))
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return &Error{Op: op, Resource: clip(k.resource), Err: errs[0], asIs: true}
	}
	return &Error{Op: op, Resource: clip(k.resource), Err: errors.Join(errs...), asIs: true}
}

// keeperPanic carries a panic out of the keeper's goroutine (see run).
type keeperPanic struct {
	done     bool  // the keeper returned
	panicked bool  // it panicked, with value
	value    any   // what it panicked with
	cause    error // fn's context's cause, when the keeper did not return
}

// catch, deferred by the keeper, recovers its panic and ends the trust in
// the lease. A keeper that neither returned nor panicked called
// runtime.Goexit (code of the pool's calling t.FailNow, say): the renewals
// are over all the same, but there is no panic to raise again.
func (p *keeperPanic) catch(cancel context.CancelCauseFunc) {
	if p.done {
		return
	}
	p.value = recover()
	if p.value == nil {
		p.cause = fmt.Errorf("%w: a renewal exited its goroutine (runtime.Goexit)", ErrLeaseLost)
	} else {
		p.panicked = true
		p.cause = fmt.Errorf("%w: a renewal panicked (raised again when the callback returns): %w", ErrLeaseLost, panicError(p.value))
	}
	cancel(p.cause)
}

// panicError is a recovered panic's value as an error: itself when it is
// one (errors.Is and errors.As then find it), else its text.
func panicError(v any) error {
	if err, ok := v.(error); ok {
		return err
	}
	return fmt.Errorf("%v", v)
}

// releaseTries bounds how many times releaseRetrying releases. A retry
// runs on a connection that has just answered a ping (withLivePin: a pool
// can hand out every dead connection it holds in a row, since pgxpool
// checks only connections idle for over a second), so a second attempt
// fails on the connection only if the server or the network did meanwhile.
const releaseTries = 4

// releaseRetrying releases, retrying (up to releaseTries times, within ctx)
// when the attempt failed on the connection rather than in the database: a
// pooled connection found dead after the work. If an earlier attempt's
// outcome was unknown and a retry finds the lease gone (ErrLeaseLost), the
// earlier attempt released it, and that is success.
func releaseRetrying(ctx context.Context, release func(context.Context) error) error {
	unknown := false
	var err error
	for i := range releaseTries {
		if i == 1 {
			ctx = withLivePin(ctx)
		}
		err = release(ctx)
		switch {
		case err == nil:
			return nil
		case unknown && errors.Is(err, ErrLeaseLost):
			return nil
		case !connectionFailed(err) || ctx.Err() != nil:
			return err
		}
		unknown = unknown || outcomeUnknown(err)
	}
	return err
}

// connectionFailed reports an error of the connection, not of the statement
// or of the caller: no lease verdict, no context error, and either no server
// error or one that ends the session (class 08, connection exception; 57P0x,
// a terminated backend or a server shutting down).
func connectionFailed(err error) bool {
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P0")
	}
	return true
}

// keep renews on schedule until ctx ends (returning nil) or the lease is lost
// (cancelling the callback with the loss as cause, and returning it).
func (k keepAlive) keep(ctx context.Context, s schedule, cancelFn context.CancelCauseFunc) error {
	deadline := k.started.Add(k.ttl - s.margin)
	trust := time.NewTimer(time.Until(deadline))
	defer trust.Stop()
	tick := time.NewTimer(s.every)
	defer tick.Stop()
	var lastErr error // the last transient renewal error, reported if the window closes
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-trust.C:
			err := &Error{Op: "keep alive", Resource: k.resource, Err: errors.Join(
				fmt.Errorf("%w: no successful renewal within TTL minus margin (%v)", ErrLeaseLost, k.ttl-s.margin), lastErr)}
			cancelFn(err)
			return err
		case <-tick.C:
		}
		t0 := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := k.renew(rctx)
		cancel()
		switch {
		case err == nil:
			lastErr = nil
			deadline = t0.Add(k.ttl - s.margin)
			trust.Reset(time.Until(deadline))
			tick.Reset(s.every)
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrLeaseLost):
			cancelFn(err)
			return err
		case errors.Is(err, ErrNotFound):
			err = &Error{Op: "keep alive", Resource: k.resource, Err: errors.Join(ErrLeaseLost, err)}
			cancelFn(err)
			return err
		default:
			lastErr = err
			tick.Reset(max(s.every/4, time.Millisecond))
		}
	}
}
