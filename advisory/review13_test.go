package advisory_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// panicTracer panics in the event named by at.
type panicTracer struct{ at string }

func (p panicTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	if p.at == "TraceAcquireStart" {
		panic("tracer bug in TraceAcquireStart")
	}
	return ctx
}

func (p panicTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {
	if p.at == "TraceAcquireEnd" {
		panic("tracer bug in TraceAcquireEnd")
	}
}

func (p panicTracer) TraceRelease(context.Context, advisory.TraceReleaseData) {
	if p.at == "TraceRelease" {
		panic("tracer bug in TraceRelease")
	}
}

// syncBuffer is a log destination safe for the watcher's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Review round 13: a tracer that panicked inside a lock call (the metrics
// collector with unsorted buckets did, at its first observation) unwound
// the call past its cleanup: the key stayed granted and the pooled
// connection stayed acquired, so pool.Close hung. A tracer's panic is now
// recovered and logged, and every helper ends as if the tracer had
// returned.
func TestTracerPanicLeavesNoLockOrConnection(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	for _, at := range []string{"TraceAcquireStart", "TraceAcquireEnd", "TraceRelease"} {
		t.Run(at, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			pool := pgtest.NewPool(t, cfg)
			logs := &syncBuffer{}
			l := newLocker(t, pool, advisory.Config{Tracer: panicTracer{at: at}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			k := key(t)
			ran := 0
			require.NotPanics(t, func() {
				require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { ran++; return nil }))
				require.NoError(t, l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { ran++; return nil }))
				h, err := l.Lock(ctx, k, nil)
				require.NoError(t, err)
				require.NoError(t, h.Unlock(ctx))
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.LockInTx(ctx, tx, k, nil) }))
			})
			assert.Equal(t, 2, ran)
			assert.Zero(t, pool.Stat().AcquiredConns(), "every connection went back")
			classid, objid, objsubid := k.PgLocks()
			var n int
			require.NoError(t, admin.QueryRow(ctx, "SELECT count(*)::int FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = $3",
				classid, objid, objsubid).Scan(&n))
			assert.Zero(t, n, "the key is free")
			assert.Contains(t, logs.String(), "tracer panicked")
			assert.Contains(t, logs.String(), at)
		})
	}
}

// Review round 13: ListLocks promises that "a role without
// pg_read_all_stats sees other users' Query and State as empty"; Query
// read "<insufficient privilege>", PostgreSQL's placeholder.
func TestListLocksUnprivilegedSeesEmptyQuery(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	k := key(t)
	conn, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	v, _ := k.Int64()
	_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock($1)", v)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_catalog.pg_advisory_unlock_all()") }()

	weak := rolePool(t, nil)
	locks, err := advisory.ListLocks(ctx, weak, k)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	assert.Equal(t, "", locks[0].Query, "another user's query")
	assert.Equal(t, "", locks[0].State)

	locks, err = advisory.ListLocks(ctx, admin, k)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	assert.Contains(t, locks[0].Query, "pg_advisory_lock", "a superuser sees it")
}

// countTracer counts events and records a context value it set at start.
type countTracer struct {
	mu                       sync.Mutex
	starts, ends, rels, seen int
}

func (c *countTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts++
	return context.WithValue(ctx, c, c) // a key of its own
}

func (c *countTracer) TraceAcquireEnd(ctx context.Context, _ advisory.TraceAcquireEndData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ends++
	if ctx.Value(c) == c {
		c.seen++
	}
}

func (c *countTracer) TraceRelease(context.Context, advisory.TraceReleaseData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rels++
}

// Review round 14: in a MultiTracer, a tracer that panicked in
// TraceAcquireStart dropped the context the tracers before it had built
// (their TraceAcquireEnd got the caller's), and one that panicked in any
// event kept it from the tracers after it. Every tracer now gets every
// event, with its own context.
func TestMultiTracerPanicKeepsTheOthers(t *testing.T) {
	ctx := testCtx(t)
	for _, at := range []string{"TraceAcquireStart", "TraceAcquireEnd", "TraceRelease"} {
		t.Run(at, func(t *testing.T) {
			before, after := &countTracer{}, &countTracer{}
			logs := &syncBuffer{}
			l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: advisory.MultiTracer{before, panicTracer{at: at}, after},
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			require.NoError(t, l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil }))
			for name, c := range map[string]*countTracer{"before": before, "after": after} {
				assert.Equal(t, 1, c.starts, name)
				assert.Equal(t, 1, c.ends, name)
				assert.Equal(t, 1, c.seen, "%s: TraceAcquireEnd got the context its TraceAcquireStart returned", name)
				assert.Equal(t, 1, c.rels, name)
			}
			assert.Contains(t, logs.String(), "tracer panicked")
		})
	}
}

// Review round 14: a WithXactLockBatch reader that panics (re-raised, as
// documented) skipped the batch's tracing: TraceAcquireEnd never came, and
// a gauge of acquisitions in progress stayed up for good. The acquisition
// and the lock end once each.
func TestBatchReaderPanicEndsTheTrace(t *testing.T) {
	ctx := testCtx(t)
	c := &countTracer{}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: c})
	b := &pgx.Batch{}
	b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { panic("reader bug") })
	require.Panics(t, func() { _ = l.WithXactLockBatch(ctx, []keys.Key{key(t)}, nil, b) })
	assert.Equal(t, 1, c.starts)
	assert.Equal(t, 1, c.ends, "the acquisition ended")
	assert.Equal(t, 1, c.rels, "and the lock, granted before the reader ran")
}
