package advisory_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// panickyQueryTracer is a pgx QueryTracer and BatchTracer (the pool's ConnConfig.Tracer,
// not the Locker's) that panics once, at the end of the first statement
// (or batch with a statement) whose text contains match after it is
// armed: after the server answered it.
type panickyQueryTracer struct {
	armed atomic.Bool
	match string
}

type tracedSQLKey struct{}

func (p *panickyQueryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tracedSQLKey{}, d.SQL)
}

func (p *panickyQueryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(tracedSQLKey{}).(string); strings.Contains(sql, p.match) && p.armed.CompareAndSwap(true, false) {
		panic("query tracer bug")
	}
}

type batchMatchKey struct{}

func (p *panickyQueryTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, batchMatchKey{}, new(bool))
}

func (p *panickyQueryTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if m, _ := ctx.Value(batchMatchKey{}).(*bool); m != nil && strings.Contains(d.SQL, p.match) {
		*m = true
	}
}

func (p *panickyQueryTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if m, _ := ctx.Value(batchMatchKey{}).(*bool); m != nil && *m && p.armed.CompareAndSwap(true, false) {
		panic("query tracer bug")
	}
}

// Review 15a: a pgx QueryTracer of the pool that panicked at the end of
// the lock statement (the lock granted) unwound through the library with
// the connection still pinned: the key stayed held by that session, and
// the connection out of the pool, for the rest of the process. Now the
// connection is destroyed, which releases whatever it holds, and the
// panic goes on up. Likewise for a statement on a shared holder
// connection (TryLock beside another held lock: every lock on it is lost)
// and for the unlock.
func TestPoolQueryTracerPanicLeavesNoLockBehind(t *testing.T) {
	p := newProbe(t)
	cases := []struct {
		name, match string
		call        func(ctx context.Context, l *advisory.Locker, k keys.Key)
		// other is a lock held on the Locker's holder connection
		// beside the call's, lost with it
		other     bool
		dedicated bool // Config.DisableMultiplexing
	}{
		{"WithLock/lock", "pg_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		}, false, false},
		{"TryWithLock/lock", "pg_try_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.TryWithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		}, false, false},
		{"WithLockAll/lock", "pg_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.WithLockAll(ctx, []keys.Key{k, key(t)}, nil, func(context.Context, *pgx.Conn) error { return nil })
		}, false, false},
		{"Lock/lock", "pg_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_, _ = l.Lock(ctx, k, nil)
		}, false, false},
		{"TryLock/lock on a new holder", "pg_try_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_, _ = l.TryLock(ctx, k, nil)
		}, false, false},
		{"TryLock/lock beside another lock", "pg_try_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_, _ = l.TryLock(ctx, k, nil)
		}, true, false},
		{"WithLock/unlock", "pg_advisory_unlock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		}, false, false},
		{"Lock/unlock", "pg_advisory_unlock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			h, err := l.Lock(ctx, k, nil)
			require.NoError(t, err)
			_ = h.Unlock(ctx)
		}, false, false},
		{"dedicated/Lock/lock", "pg_advisory_lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_, _ = l.Lock(ctx, k, nil)
		}, false, true},
		{"dedicated/Lock/unlock", "pg_advisory_unlock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			h, err := l.Lock(ctx, k, nil)
			require.NoError(t, err)
			_ = h.Unlock(ctx)
		}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			tr := &panickyQueryTracer{match: tc.match}
			cfg := pgtest.Config(t)
			cfg.MaxConns = 2
			cfg.ConnConfig.Tracer = tr
			pool := pgtest.NewPool(t, cfg)
			ends := &endTracer{}
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: tc.dedicated, Tracer: ends})
			var other *advisory.Lock
			if tc.other {
				var err error
				other, err = l.TryLock(ctx, key(t), nil)
				require.NoError(t, err)
			}
			k := key(t)
			tr.armed.Store(true)
			var got any
			func() {
				defer func() { got = recover() }()
				tc.call(ctx, l, k)
			}()
			require.Equal(t, "query tracer bug", got, "the tracer's panic goes on up")
			// the socket is closed at once; the server releases the key
			// when its backend reads the end of the stream
			assert.Eventually(t, func() bool { return p.free(ctx, k, false) }, 10*time.Second, time.Millisecond,
				"the key is free: the connection that may have held it is gone")
			if other != nil {
				<-other.Done() // lost with the shared connection
				require.ErrorIs(t, other.Err(), advisory.ErrLockLost)
			}
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns(), "no connection is kept out of the pool")
			ends.mu.Lock()
			assert.Equal(t, ends.starts, ends.acqEnds, "every traced acquisition start has its end (review 18: a waiting gauge stayed up)")
			ends.mu.Unlock()
			require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }), "the key can be taken again")
		})
	}
}

// argsTracer records, as printed, the arguments of every statement whose
// text contains match.
type argsTracer struct {
	match string
	mu    sync.Mutex
	got   [][]string
}

func (a *argsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, a.match) {
		var s []string
		for _, v := range d.Args {
			s = append(s, fmt.Sprint(v))
		}
		a.mu.Lock()
		a.got = append(a.got, s)
		a.mu.Unlock()
	}
	return ctx
}

func (*argsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (a *argsTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (a *argsTracer) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	a.TraceQueryStart(ctx, c, pgx.TraceQueryStartData{SQL: d.SQL, Args: d.Args})
}

func (*argsTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// The arguments pgx's tracers see for a one-key statement (pointers into
// the call's state) print as the key and the lock_timeout text, as a
// tracer such as tracelog logs them.
func TestPoolQueryTracerSeesArgumentValues(t *testing.T) {
	ctx := testCtx(t)
	tr := &argsTracer{match: "advisory_lock"}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Tracer = tr
	l := newLocker(t, pgtest.NewPool(t, cfg), advisory.Config{})
	v := pgtest.UniqueInt64(t)
	noop := func(context.Context, *pgx.Conn) error { return nil }
	require.NoError(t, l.WithLock(ctx, keys.Int64(v), nil, noop)) // ctx has a deadline: lock_timeout
	require.NoError(t, l.TryWithLock(ctx, keys.Pair(-7, 2147483647), nil, noop))
	require.Len(t, tr.got, 2)
	assert.Equal(t, strconv.FormatInt(v, 10), tr.got[0][0])
	assert.Regexp(t, `^[0-9]+ms$`, tr.got[0][1])
	assert.Equal(t, []string{"-7", "2147483647"}, tr.got[1])

	// A transaction call's lock_timeout, set before the lock (review 16:
	// a *string, it printed as a pointer).
	tr.match = "'lock_timeout'"
	tr.got = nil
	require.NoError(t, l.WithXactLock(ctx, keys.Int64(v), nil, func(context.Context, pgx.Tx) error { return nil }))
	// Then the restore of the session's own value before fn (here the
	// server's, 0), a pointer too.
	require.Len(t, tr.got, 2)
	require.Len(t, tr.got[0], 1)
	assert.Regexp(t, `^[0-9]+ms$`, tr.got[0][0])
	assert.Equal(t, []string{"0"}, tr.got[1])
}

// Review 16: a handle whose Unlock panicked (a pgx tracer's panic in the
// unlock statement) kept its state: Done never closed, Err stayed nil, and
// a second Unlock waited forever for the first; with DisableMultiplexing
// the connection was kept too. The lock is lost now, as its connection is.
func TestHandleWhoseUnlockPanickedIsLost(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) {
			ctx := testCtx(t)
			tr := &panickyQueryTracer{match: "pg_advisory_unlock"}
			cfg := pgtest.Config(t)
			cfg.ConnConfig.Tracer = tr
			pool := pgtest.NewPool(t, cfg)
			ends := &endTracer{}
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: dedicated, MaxConns: 1, Tracer: ends})
			k := key(t)
			h, err := l.Lock(ctx, k, nil)
			require.NoError(t, err)
			tr.armed.Store(true)
			var got any
			func() {
				defer func() { got = recover() }()
				_ = h.Unlock(ctx)
			}()
			require.Equal(t, "query tracer bug", got)
			select {
			case <-h.Done():
			case <-time.After(time.Minute): // a guard, not a budget
				t.Fatal("Done never closed")
			}
			require.ErrorIs(t, h.Err(), advisory.ErrLockLost)
			again := make(chan error, 1)
			go func() { again <- h.Unlock(ctx) }()
			select {
			case err := <-again:
				require.ErrorIs(t, err, advisory.ErrLockLost)
			case <-time.After(time.Minute):
				t.Fatal("a second Unlock waits for the first forever")
			}
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
			ends.mu.Lock()
			assert.Equal(t, 1, ends.lost, "the lock's end is traced once, as a loss (review 17: dedicated, never)")
			assert.Zero(t, ends.released)
			ends.mu.Unlock()
			require.NoError(t, l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil }),
				"the key, and the Locker's one connection slot, are free")
		})
	}
}

// endTracer counts acquisitions' starts and ends, and how held locks
// end: TraceRelease and TraceLost.
type endTracer struct {
	mu                              sync.Mutex
	starts, acqEnds, released, lost int
}

func (e *endTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.starts++
	return ctx
}

func (e *endTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.acqEnds++
}

func (e *endTracer) TraceRelease(context.Context, advisory.TraceReleaseData) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.released++
}

func (e *endTracer) TraceLost(context.Context, advisory.TraceLostData) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lost++
}

// acquirePanicTracer is a pgx QueryTracer that is also a pgxpool
// AcquireTracer, and panics once armed when the pool starts an Acquire.
type acquirePanicTracer struct{ armed atomic.Bool }

func (*acquirePanicTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (*acquirePanicTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *acquirePanicTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if p.armed.CompareAndSwap(true, false) {
		panic("acquire tracer bug")
	}
	return ctx
}

func (*acquirePanicTracer) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
}

// Review 19: a panic while the Locker draws a connection (here a pgxpool
// AcquireTracer's). A multiplexed Try call had registered the holder
// connection it was opening, which the calls after it share: it stayed
// "opening" for good, and every later TryLock failed with ErrNoConnection
// (a blocking Lock hung). And WithXactLockBatch's acquisition was never
// traced as ended. After the panic the Locker works, and every traced
// start has its end.
func TestPoolAcquirePanicLeavesTheLockerWorking(t *testing.T) {
	forms := []struct {
		name string
		call func(ctx context.Context, l *advisory.Locker, k keys.Key)
	}{
		{"TryLock", func(ctx context.Context, l *advisory.Locker, k keys.Key) { _, _ = l.TryLock(ctx, k, nil) }},
		{"TryLockAll", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_, _ = l.TryLockAll(ctx, []keys.Key{k, key(t)}, nil)
		}},
		{"Lock", func(ctx context.Context, l *advisory.Locker, k keys.Key) { _, _ = l.Lock(ctx, k, nil) }},
		{"WithLock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.WithLock(ctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
		}},
		{"WithXactLock", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			_ = l.WithXactLock(ctx, k, nil, func(context.Context, pgx.Tx) error { return nil })
		}},
		{"WithXactLockBatch", func(ctx context.Context, l *advisory.Locker, k keys.Key) {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			_ = l.WithXactLockBatch(ctx, []keys.Key{k}, nil, b)
		}},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			ctx := testCtx(t)
			tr := &acquirePanicTracer{}
			cfg := pgtest.Config(t)
			cfg.ConnConfig.Tracer = tr
			pool := pgtest.NewPool(t, cfg)
			ends := &endTracer{}
			l := newLocker(t, pool, advisory.Config{LockTimeout: 10 * time.Second, Tracer: ends})
			tr.armed.Store(true)
			var got any
			func() {
				defer func() { got = recover() }()
				f.call(ctx, l, key(t))
			}()
			require.Equal(t, "acquire tracer bug", got)
			h, err := l.TryLock(ctx, key(t), nil)
			require.NoError(t, err, "a later Try call is served")
			require.NoError(t, h.Unlock(ctx))
			h, err = l.Lock(ctx, key(t), nil)
			require.NoError(t, err, "a later blocking call is served")
			require.NoError(t, h.Unlock(ctx))
			assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
			ends.mu.Lock()
			assert.Equal(t, ends.starts, ends.acqEnds, "every traced acquisition start has its end")
			ends.mu.Unlock()
		})
	}
}
