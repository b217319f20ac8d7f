package advisory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgxlock/pgxlock/keys"
)

// Tracing follows pgx: Config.Tracer is an AcquireTracer and may also
// implement ReleaseTracer and LostTracer, found by type assertion. Use
// MultiTracer to install several. Tracers are called synchronously on the
// caller's goroutine (TraceLost on the watcher's when the watcher finds
// the loss, else on the unlocking caller's) and must be fast and
// safe for concurrent use. A tracer that panics is recovered: the panic is
// logged with Config.Logger at level Error, and the call goes on as if it
// had returned, so that a broken tracer never leaves a lock or a
// connection behind; in a MultiTracer the other tracers still get the
// event, and the context that TraceAcquireStart built before the panic is
// kept. (A tracer must not call runtime.Goexit, as t.FailNow does: that
// cannot be recovered, and ends the goroutine with the call's lock and
// connection as they are.) Keys in trace data are the call's keys, sorted
// and de-duplicated; they must not be retained and modified.

// Scope is a lock's lifetime: a session or a transaction.
type Scope string

// Scopes.
const (
	ScopeSession Scope = "session"
	ScopeXact    Scope = "xact"
)

// Outcome classifies how an acquisition ended.
type Outcome string

// Outcomes of TraceAcquireEnd.
const (
	OutcomeAcquired  Outcome = "acquired"
	OutcomeBusy      Outcome = "busy"      // a Try call found a key held
	OutcomeTimeout   Outcome = "timeout"   // ErrLockTimeout
	OutcomeDeadlock  Outcome = "deadlock"  // ErrDeadlock
	OutcomeCancelled Outcome = "cancelled" // the context was cancelled
	// OutcomeNoConnection: ErrNoConnection, no connection could be had in
	// time (the context was not cancelled).
	OutcomeNoConnection Outcome = "no-connection"
	OutcomeError        Outcome = "error" // anything else
)

// OutcomeOf classifies an error returned by this package's lock calls.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, ErrNotAcquired):
		return OutcomeBusy
	case errors.Is(err, ErrLockTimeout):
		return OutcomeTimeout
	case errors.Is(err, ErrDeadlock):
		return OutcomeDeadlock
	case errors.Is(err, context.Canceled):
		return OutcomeCancelled
	case errors.Is(err, ErrNoConnection):
		return OutcomeNoConnection
	}
	return OutcomeError
}

// TraceAcquireStartData describes an acquisition that begins.
type TraceAcquireStartData struct {
	Keys   []keys.Key
	Scope  Scope
	Shared bool
	Try    bool // false: the call may wait
	// CallerTx: the lock is taken in the caller's own transaction
	// (LockInTx, TryLockInTx, LockAllInTx, TryLockAllInTx). Its end belongs
	// to the caller: no TraceRelease or TraceLost follows its acquisition,
	// so a tracer that counts locks held must not count it.
	CallerTx bool
}

// TraceAcquireEndData describes how it ended.
type TraceAcquireEndData struct {
	TraceAcquireStartData
	Waited  time.Duration // from start to outcome, including the wait for a connection
	Outcome Outcome
	Err     error // nil when acquired
}

// TraceReleaseData describes a release: an unlock (session) or the end of
// the transaction (xact).
type TraceReleaseData struct {
	Keys   []keys.Key
	Scope  Scope
	Shared bool
	Held   time.Duration
	Err    error // a failed unlock (ErrNotHeld, ...) or nil
}

// TraceLostData describes a held session lock whose connection died. It is
// sent once per lost lock, by whichever sees the loss first: the watcher of
// a Lock or Hold, or the unlock of Lock.Unlock, Hold, WithLock or
// WithLockAll. A lost lock gets no TraceRelease.
type TraceLostData struct {
	Keys   []keys.Key
	Shared bool
	Held   time.Duration
	Err    error // matches ErrLockLost, wraps the cause
}

// AcquireTracer traces acquisitions. TraceAcquireStart may return a derived
// context (a span); it is passed to TraceAcquireEnd and, when acquired, to
// the release and loss events of the same lock.
type AcquireTracer interface {
	TraceAcquireStart(ctx context.Context, data TraceAcquireStartData) context.Context
	TraceAcquireEnd(ctx context.Context, data TraceAcquireEndData)
}

// ReleaseTracer traces releases of acquired locks.
type ReleaseTracer interface {
	TraceRelease(ctx context.Context, data TraceReleaseData)
}

// LostTracer traces losses of held session locks. TraceLost runs before
// the lock's Done closes; it may call the lost lock's Unlock, or that of
// another lock lost with it (on the same holder connection), which then
// returns an error matching ErrLockLost without waiting, even while
// another Unlock of that lock is under way.
type LostTracer interface {
	TraceLost(ctx context.Context, data TraceLostData)
}

// MultiTracer fans every event out to each of its tracers that implements
// the event's interface, in order. A tracer that panics does not keep the
// event from those after it: once all have had it, the first panic goes on
// (carrying, from TraceAcquireStart, the context built so far, which a
// Locker keeps; see "Tracing" above).
type MultiTracer []AcquireTracer

// TracerPanic is what a MultiTracer's TraceAcquireStart panics with when one
// of its tracers panicked: the tracer's panic value, and the context the
// tracers built (those before the panicking one, and those after it).
type TracerPanic struct {
	Value any
	Ctx   context.Context
}

// Error describes the panic.
func (p *TracerPanic) Error() string { return fmt.Sprintf("advisory: tracer panicked: %v", p.Value) }

// guarded runs fn and returns its panic value, nil when it returned.
func guarded(fn func()) (v any) {
	defer func() { v = recover() }()
	fn()
	return nil
}

// TraceAcquireStart implements AcquireTracer.
func (m MultiTracer) TraceAcquireStart(ctx context.Context, data TraceAcquireStartData) context.Context {
	var first any
	for _, t := range m {
		if v := guarded(func() { ctx = t.TraceAcquireStart(ctx, data) }); v != nil && first == nil {
			first = v
		}
	}
	if first != nil {
		panic(&TracerPanic{Value: first, Ctx: ctx})
	}
	return ctx
}

// TraceAcquireEnd implements AcquireTracer.
func (m MultiTracer) TraceAcquireEnd(ctx context.Context, data TraceAcquireEndData) {
	var first any
	for _, t := range m {
		if v := guarded(func() { t.TraceAcquireEnd(ctx, data) }); v != nil && first == nil {
			first = v
		}
	}
	if first != nil {
		panic(first)
	}
}

// TraceRelease implements ReleaseTracer.
func (m MultiTracer) TraceRelease(ctx context.Context, data TraceReleaseData) {
	var first any
	for _, t := range m {
		if rt, ok := t.(ReleaseTracer); ok {
			if v := guarded(func() { rt.TraceRelease(ctx, data) }); v != nil && first == nil {
				first = v
			}
		}
	}
	if first != nil {
		panic(first)
	}
}

// TraceLost implements LostTracer.
func (m MultiTracer) TraceLost(ctx context.Context, data TraceLostData) {
	var first any
	for _, t := range m {
		if lt, ok := t.(LostTracer); ok {
			if v := guarded(func() { lt.TraceLost(ctx, data) }); v != nil && first == nil {
				first = v
			}
		}
	}
	if first != nil {
		panic(first)
	}
}

// span follows one acquisition and, once acquired, the lock it gave.
type span struct {
	l     *Locker
	ctx   context.Context // the tracer's context
	data  TraceAcquireStartData
	start time.Time // zero where the Locker is silent: nothing reads the times
	got   time.Time

	acqEnded bool // acquired has run: the acquisition's end is traced
}

// endCut, deferred where an acquisition starts, traces its end when a
// panic unwound past the code that would have (a pgx tracer's panic in the
// lock statement, say: the connection, and any lock it was granted, went
// with it): TraceAcquireEnd with an error, once. On every other path the
// acquisition has ended by then, and endCut does nothing.
func (s *span) endCut(op string) {
	if !s.acqEnded {
		s.acquired(&LockError{Op: op, Keys: s.data.Keys, Err: errStatementPanicked})
	}
}

func (l *Locker) startSpan(ctx context.Context, scope Scope, ks []keys.Key, shared, try bool) *span {
	s := &span{}
	l.initSpan(s, ctx, scope, ks, shared, try)
	return s
}

// initSpan is startSpan in place, for a span kept in a call's state.
func (l *Locker) initSpan(s *span, ctx context.Context, scope Scope, ks []keys.Key, shared, try bool) {
	*s = span{l: l, ctx: ctx, data: TraceAcquireStartData{Keys: ks, Scope: scope, Shared: shared, Try: try}}
	if !l.silent {
		s.start = time.Now()
	}
	if l.cfg.Tracer != nil {
		s.traceStart()
	}
}

// initSpanInTx is initSpan for a lock taken in the caller's transaction
// (TraceAcquireStartData.CallerTx).
func (l *Locker) initSpanInTx(s *span, ctx context.Context, ks []keys.Key, shared, try bool) {
	*s = span{l: l, ctx: ctx, data: TraceAcquireStartData{Keys: ks, Scope: ScopeXact, Shared: shared, Try: try, CallerTx: true}}
	if !l.silent {
		s.start = time.Now()
	}
	if l.cfg.Tracer != nil {
		s.traceStart()
	}
}

func (s *span) traceStart() {
	if v := guarded(func() { s.ctx = s.l.cfg.Tracer.TraceAcquireStart(s.ctx, s.data) }); v != nil {
		if tp, ok := v.(*TracerPanic); ok { // a MultiTracer's: keep what its other tracers built
			s.ctx, v = tp.Ctx, tp.Value
		}
		s.logPanic("TraceAcquireStart", v)
	}
}

// recoverTracer, deferred around a tracer's call, logs and drops its panic
// (see "Tracing" above): the call's own cleanup must still run.
func (s *span) recoverTracer(event string) {
	if r := recover(); r != nil {
		s.logPanic(event, r)
	}
}

func (s *span) logPanic(event string, v any) {
	s.l.log.ErrorContext(s.ctx, "advisory: tracer panicked; the event was dropped",
		"event", event, "panic", v, "scope", s.data.Scope, "keys", keyStrings(s.data.Keys))
}

// acquired ends the acquisition with err (nil: acquired).
func (s *span) acquired(err error) {
	s.acqEnded = true
	if s.l.silent {
		return // nothing would see the event or its times
	}
	s.got = time.Now()
	out := OutcomeOf(err)
	if t := s.l.cfg.Tracer; t != nil {
		func() {
			defer s.recoverTracer("TraceAcquireEnd")
			t.TraceAcquireEnd(s.ctx, TraceAcquireEndData{TraceAcquireStartData: s.data, Waited: s.got.Sub(s.start), Outcome: out, Err: err})
		}()
	}
	level := slog.LevelDebug
	if out == OutcomeError || out == OutcomeDeadlock {
		level = slog.LevelWarn
	}
	if s.l.log.Enabled(s.ctx, level) {
		attrs := []any{"scope", s.data.Scope, "keys", keyStrings(s.data.Keys), "shared", s.data.Shared,
			"try", s.data.Try, "outcome", out, "waited", s.got.Sub(s.start)}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		s.l.log.Log(s.ctx, level, "advisory lock acquire", attrs...)
	}
}

func (s *span) released(err error) {
	if s.l.silent {
		return
	}
	held := time.Since(s.got)
	if rt, ok := s.l.cfg.Tracer.(ReleaseTracer); ok {
		func() {
			defer s.recoverTracer("TraceRelease")
			rt.TraceRelease(s.ctx, TraceReleaseData{Keys: s.data.Keys, Scope: s.data.Scope, Shared: s.data.Shared, Held: held, Err: err})
		}()
	}
	level := slog.LevelDebug
	if err != nil {
		level = slog.LevelWarn
	}
	if s.l.log.Enabled(s.ctx, level) {
		attrs := []any{"scope", s.data.Scope, "keys", keyStrings(s.data.Keys), "shared", s.data.Shared, "held", held}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		s.l.log.Log(s.ctx, level, "advisory lock release", attrs...)
	}
}

// ended reports the end of a held session lock by its unlock, whose error
// is err: a loss (err matches ErrLockLost: the unlock found the connection
// dead) goes to TraceLost, anything else to TraceRelease. Each held lock
// ends exactly once, by ended or by lost.
func (s *span) ended(err error) {
	if errors.Is(err, ErrLockLost) {
		s.lost(err)
		return
	}
	s.released(err)
}

func (s *span) lost(err error) {
	held := time.Since(s.got)
	if lt, ok := s.l.cfg.Tracer.(LostTracer); ok {
		func() {
			defer s.recoverTracer("TraceLost")
			lt.TraceLost(s.ctx, TraceLostData{Keys: s.data.Keys, Shared: s.data.Shared, Held: held, Err: err})
		}()
	}
	s.l.log.WarnContext(s.ctx, "advisory lock lost; connection destroyed",
		"scope", s.data.Scope, "keys", keyStrings(s.data.Keys), "shared", s.data.Shared, "held", held, "err", err)
}
