package advisory_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// recorder is a tracer that records every event.
type recorder struct {
	mu     sync.Mutex
	events []string
	ends   []advisory.TraceAcquireEndData
	rels   []advisory.TraceReleaseData
	losts  []advisory.TraceLostData
}

type spanKey struct{}

func (r *recorder) TraceAcquireStart(ctx context.Context, d advisory.TraceAcquireStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "start:"+string(d.Scope))
	return context.WithValue(ctx, spanKey{}, len(r.events))
}

func (r *recorder) TraceAcquireEnd(ctx context.Context, d advisory.TraceAcquireEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(spanKey{}) == nil {
		panic("span context not passed on")
	}
	r.events = append(r.events, "end:"+string(d.Outcome))
	r.ends = append(r.ends, d)
}

func (r *recorder) TraceRelease(ctx context.Context, d advisory.TraceReleaseData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "release:"+string(d.Scope))
	r.rels = append(r.rels, d)
}

func (r *recorder) TraceLost(ctx context.Context, d advisory.TraceLostData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "lost")
	r.losts = append(r.losts, d)
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// startOnly implements only AcquireTracer: MultiTracer must skip it for
// release and loss events.
type startOnly struct{ n int }

func (s *startOnly) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	s.n++
	return ctx
}
func (s *startOnly) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) { s.n++ }

func TestTracerSeesAcquireReleaseAndOutcomes(t *testing.T) {
	ctx := testCtx(t)
	rec := &recorder{}
	other := &startOnly{}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := newLocker(t, pgtest.Pool(t), advisory.Config{
		Tracer: advisory.MultiTracer{rec, other}, Logger: logger, LockTimeout: 100 * time.Millisecond,
	})
	secret := "customer-4711@example.com"
	k := keys.Hash(secret)

	require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }))
	require.NoError(t, l.WithXactLock(ctx, k, &advisory.Options{Shared: true}, func(context.Context, pgx.Tx) error { return nil }))
	h := hold(ctx, t, false, k)
	assert.ErrorIs(t, l.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }), advisory.ErrNotAcquired)
	assert.ErrorIs(t, l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil }), advisory.ErrLockTimeout)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, l.WithLock(cctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }), context.Canceled)
	h.release()

	assert.Equal(t, []string{
		"start:session", "end:acquired", "release:session",
		"start:xact", "end:acquired", "release:xact",
		"start:session", "end:busy",
		"start:xact", "end:timeout",
		"start:session", "end:cancelled",
	}, rec.snapshot())
	assert.Equal(t, 10, other.n, "start and end reach every tracer")
	assert.Equal(t, []keys.Key{k}, rec.ends[0].Keys)
	assert.True(t, rec.ends[1].Shared)
	assert.Equal(t, advisory.ScopeXact, rec.ends[1].Scope)
	assert.True(t, rec.ends[2].Try)
	assert.GreaterOrEqual(t, rec.ends[3].Waited, 100*time.Millisecond, "the timed-out wait is measured")
	assert.ErrorIs(t, rec.ends[3].Err, advisory.ErrLockTimeout)
	assert.NoError(t, rec.rels[0].Err)

	out := logs.String()
	assert.Contains(t, out, "advisory lock acquire")
	assert.Contains(t, out, "outcome=timeout")
	assert.Contains(t, out, k.String())
	assert.NotContains(t, out, secret, "logs never show a hashed key's source string")
}

func TestTracerSeesLoss(t *testing.T) {
	ctx := testCtx(t)
	rec := &recorder{}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: rec})
	k := key(t)
	lk, err := l.Lock(ctx, k, nil)
	require.NoError(t, err)
	terminate(ctx, t, k)
	<-lk.Done()
	require.ErrorIs(t, lk.Unlock(ctx), advisory.ErrLockLost)
	assert.Equal(t, []string{"start:session", "end:acquired", "lost"}, rec.snapshot())
	require.Len(t, rec.losts, 1)
	assert.ErrorIs(t, rec.losts[0].Err, advisory.ErrLockLost)
}

func TestOutcomeOf(t *testing.T) {
	assert.Equal(t, advisory.OutcomeAcquired, advisory.OutcomeOf(nil))
	assert.Equal(t, advisory.OutcomeBusy, advisory.OutcomeOf(&advisory.LockError{Op: "x", Err: advisory.ErrNotAcquired}))
	assert.Equal(t, advisory.OutcomeDeadlock, advisory.OutcomeOf(advisory.ErrDeadlock))
	assert.Equal(t, advisory.OutcomeCancelled, advisory.OutcomeOf(context.Canceled))
	assert.Equal(t, advisory.OutcomeNoConnection, advisory.OutcomeOf(&advisory.LockError{Op: "x", Err: advisory.ErrNoConnection}))
	assert.Equal(t, advisory.OutcomeError, advisory.OutcomeOf(errors.New("x")))
	assert.True(t, strings.HasPrefix(string(advisory.OutcomeTimeout), "time"))
}
