package advisory_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// pipeFreezer dials the server through an in-memory pipe (net.Pipe has no
// buffer: a write blocks until the other side reads, as a write into a full
// socket send buffer does) and can stop relaying.
type pipeFreezer struct{ frozen atomic.Bool }

func (f *pipeFreezer) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for f.frozen.Load() {
			time.Sleep(5 * time.Millisecond) // a frozen network: nothing moves
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (f *pipeFreezer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	s, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	a, b := net.Pipe()
	go f.relay(s, b)
	go f.relay(b, s)
	return a, nil
}

// frozenPool returns a pool of 4 connections that go through a pipeFreezer,
// and the freezer.
func frozenPool(t *testing.T) (*pgxpool.Pool, *pipeFreezer) {
	t.Helper()
	f := &pipeFreezer{}
	cfg := pgtest.Config(t)
	cfg.MaxConns = 4
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.DialFunc = f.dial
	return pgtest.NewPool(t, cfg), f
}

// freeze stops the relaying until the test ends.
func (f *pipeFreezer) freeze(t *testing.T) {
	f.frozen.Store(true)
	t.Cleanup(func() { f.frozen.Store(false) })
}

// An Unlock over a frozen network whose writes block keeps its bounds: the
// unlock's (CleanupTimeout, on a holder connection at most
// HeartbeatTimeout) and then closing the destroyed connection's (another
// CleanupTimeout). Over TLS, closing waited for crypto/tls's own 5 s
// close_notify deadline after that: the dedicated Unlock returned after
// 6.0 s with a 1 s CleanupTimeout (2.0 s now; a reviewer saw 5.3 s on a
// holder connection too, where this test sees 0.3 s either way). The
// limit asserted, 3.5 s, is the two bounds with room for a loaded machine.
func TestUnlockOverAFrozenNetworkKeepsItsBounds(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) {
			ctx := testCtx(t)
			pool, f := frozenPool(t)
			t.Logf("TLS: %v", pool.Config().ConnConfig.TLSConfig != nil)
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: dedicated,
				HeartbeatInterval: time.Minute, HeartbeatTimeout: 300 * time.Millisecond, CleanupTimeout: time.Second})
			h, err := l.TryLock(ctx, key(t), nil)
			require.NoError(t, err)
			f.freeze(t)
			done := make(chan error, 1)
			t0 := time.Now()
			go func() { done <- h.Unlock(context.Background()) }()
			select {
			case err := <-done:
				t.Logf("Unlock returned after %v: %v", time.Since(t0), err)
				assert.ErrorIs(t, err, advisory.ErrLockLost)
			case <-time.After(3500 * time.Millisecond):
				t.Fatal("Unlock over a frozen network outlasted its bounds (unlock, then close) by over 1.5 s")
			}
		})
	}
}

// unlockingLostTracer unlocks the lost lock from TraceLost, as a LostTracer
// may (trace.go), and records what that Unlock returned.
type unlockingLostTracer struct {
	mu   sync.Mutex
	h    *advisory.Lock
	errs []error
}

func (u *unlockingLostTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (*unlockingLostTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}
func (u *unlockingLostTracer) TraceLost(context.Context, advisory.TraceLostData) {
	u.mu.Lock()
	h := u.h
	u.mu.Unlock()
	err := h.Unlock(context.Background())
	u.mu.Lock()
	u.errs = append(u.errs, err)
	u.mu.Unlock()
}

// An Unlock that is first to find the connection dead (a frozen network:
// the unlock's bound ends it) traces the loss; a LostTracer that unlocks
// the lock from there must not wait for that first Unlock, which is waiting
// for it (the second review's deadlock): both return ErrLockLost.
func TestLostTracerUnlockDuringAnUnlockDoesNotDeadlock(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) {
			ctx := testCtx(t)
			pool, f := frozenPool(t)
			tr := &unlockingLostTracer{}
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: dedicated, Tracer: tr,
				HeartbeatInterval: time.Minute, HeartbeatTimeout: 300 * time.Millisecond, CleanupTimeout: 300 * time.Millisecond})
			h, err := l.TryLock(ctx, key(t), nil)
			require.NoError(t, err)
			tr.mu.Lock()
			tr.h = h
			tr.mu.Unlock()
			f.freeze(t)
			done := make(chan error, 1)
			go func() { done <- h.Unlock(context.Background()) }()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, advisory.ErrLockLost)
			case <-time.After(time.Minute):
				t.Fatal("Unlock and the LostTracer's Unlock deadlocked")
			}
			tr.mu.Lock()
			defer tr.mu.Unlock()
			require.Len(t, tr.errs, 1, "one TraceLost")
			assert.ErrorIs(t, tr.errs[0], advisory.ErrLockLost)
		})
	}
}

// unlockOthersTracer unlocks, from TraceLost, every lock it knows but the
// lost one (locks sharing the lost lock's holder connection are lost too),
// and counts the traces per key.
type unlockOthersTracer struct {
	mu   sync.Mutex
	all  []*advisory.Lock
	lost map[keys.Key]int
}

func (u *unlockOthersTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (*unlockOthersTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}
func (u *unlockOthersTracer) TraceLost(_ context.Context, d advisory.TraceLostData) {
	u.mu.Lock()
	u.lost[d.Keys[0]]++
	all := slices.Clone(u.all)
	u.mu.Unlock()
	for _, o := range all {
		if o.Keys()[0] != d.Keys[0] {
			_ = o.Unlock(context.Background())
		}
	}
}

// The fourth review's deadlock: two locks on one holder connection, both
// being unlocked over a frozen network. The first Unlock's statement runs
// out its bound and loses the connection while it holds the connection's
// turn, for which the other Unlock waits; a LostTracer that unlocks the
// other lock must not wait for that Unlock either. Both return the loss,
// each lock traced once.
func TestLostTracerUnlockingAnotherLockDoesNotDeadlock(t *testing.T) {
	ctx := testCtx(t)
	pool, f := frozenPool(t)
	tr := &unlockOthersTracer{lost: map[keys.Key]int{}}
	l := newLocker(t, pool, advisory.Config{Tracer: tr,
		HeartbeatInterval: time.Minute, HeartbeatTimeout: time.Second, CleanupTimeout: time.Second})
	a, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err)
	b, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err)
	tr.mu.Lock()
	tr.all = []*advisory.Lock{a, b}
	tr.mu.Unlock()
	f.freeze(t)
	errs := make(chan error, 2)
	for _, h := range []*advisory.Lock{a, b} {
		go func() { errs <- h.Unlock(context.Background()) }()
	}
	for range 2 {
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, advisory.ErrLockLost)
		case <-time.After(time.Minute):
			t.Fatalf("the Unlocks deadlocked (a: Err=%v, b: Err=%v)", a.Err(), b.Err())
		}
	}
	<-a.Done()
	<-b.Done()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Equal(t, 1, tr.lost[a.Keys()[0]])
	assert.Equal(t, 1, tr.lost[b.Keys()[0]])
}

// blockFirstLostTracer blocks its first TraceLost until release is closed,
// after closing tracing.
type blockFirstLostTracer struct {
	once             sync.Once
	tracing, release chan struct{}
}

func (b *blockFirstLostTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (*blockFirstLostTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}
func (b *blockFirstLostTracer) TraceLost(context.Context, advisory.TraceLostData) {
	b.once.Do(func() {
		close(b.tracing)
		<-b.release
	})
}

// A second Unlock while the first, which found the connection dead, is
// still tracing the loss returns at once with the same loss, cause
// included, and Err agrees at that moment; Done closes only after the
// trace (the fourth review: on a dedicated lock the second Unlock got a
// bare error and Err was still nil).
func TestSecondUnlockDuringTheFirstsTraceReturnsTheLoss(t *testing.T) {
	for _, dedicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedicated=%v", dedicated), func(t *testing.T) {
			ctx := testCtx(t)
			pool, f := frozenPool(t)
			tr := &blockFirstLostTracer{tracing: make(chan struct{}), release: make(chan struct{})}
			l := newLocker(t, pool, advisory.Config{DisableMultiplexing: dedicated, Tracer: tr,
				HeartbeatInterval: time.Minute, HeartbeatTimeout: 300 * time.Millisecond, CleanupTimeout: 300 * time.Millisecond})
			h, err := l.TryLock(ctx, key(t), nil)
			require.NoError(t, err)
			f.freeze(t)
			first := make(chan error, 1)
			go func() { first <- h.Unlock(context.Background()) }()
			<-tr.tracing
			second := h.Unlock(ctx)
			require.ErrorIs(t, second, advisory.ErrLockLost)
			assert.Equal(t, second, h.Err(), "Err agrees with the second Unlock")
			assert.ErrorContains(t, second, "pooltx: unlock", "the cause is kept")
			select {
			case <-h.Done():
				t.Fatal("Done closed before the trace ended")
			default:
			}
			close(tr.release)
			assert.Equal(t, second, <-first)
			<-h.Done()
		})
	}
}

// releaseUnlocksTracer unlocks other, once, from the first TraceRelease.
type releaseUnlocksTracer struct {
	fired atomic.Bool // not a sync.Once: the other Unlock traces its own release from inside
	other *advisory.Lock
	err   chan error
}

func (r *releaseUnlocksTracer) TraceAcquireStart(ctx context.Context, _ advisory.TraceAcquireStartData) context.Context {
	return ctx
}
func (*releaseUnlocksTracer) TraceAcquireEnd(context.Context, advisory.TraceAcquireEndData) {}
func (r *releaseUnlocksTracer) TraceRelease(context.Context, advisory.TraceReleaseData) {
	if r.fired.CompareAndSwap(false, true) {
		r.err <- r.other.Unlock(context.Background())
	}
}

// A ReleaseTracer that unlocks another lock of the same holder connection
// (the fifth review): the release is traced once the connection's turn is
// given back, so the other Unlock, which waits for the turn, goes through.
func TestReleaseTracerUnlockingAnotherLockDoesNotDeadlock(t *testing.T) {
	ctx := testCtx(t)
	tr := &releaseUnlocksTracer{err: make(chan error, 1)}
	l := newLocker(t, pgtest.Pool(t), advisory.Config{Tracer: tr})
	a, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err)
	b, err := l.TryLock(ctx, key(t), nil)
	require.NoError(t, err)
	admin := pgtest.Pool(t)
	require.Equal(t, holderPID(ctx, t, admin, a.Keys()[0]), holderPID(ctx, t, admin, b.Keys()[0]), "one holder connection")
	tr.other = b
	done := make(chan error, 1)
	go func() { done <- a.Unlock(context.Background()) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("a's Unlock and the ReleaseTracer's Unlock of b deadlocked")
	}
	require.NoError(t, <-tr.err)
	require.ErrorIs(t, b.Err(), advisory.ErrUnlocked)
}
