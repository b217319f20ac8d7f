package lease_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

func TestManagerExclusive(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute, Owner: "one"})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, Owner: "two"})

	a, err := m1.TryAcquire(ctx, "invoice/1", &lease.AcquireOptions{Metadata: json.RawMessage(`{"why":"test"}`)})
	require.NoError(t, err)
	assert.Equal(t, int64(1), a.Token())
	assert.Equal(t, "one", a.Owner())
	assert.Equal(t, lease.Exclusive, a.Mode())
	assert.Equal(t, time.Minute, a.ExpiresAt().Sub(a.AcquiredAt()))

	_, err = m2.TryAcquire(ctx, "invoice/1", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	_, err = m2.TryAcquire(ctx, "invoice/1", &lease.AcquireOptions{Mode: lease.Shared})
	require.ErrorIs(t, err, lease.ErrNotAcquired, "a reader is excluded by a writer")
	other, err := m2.TryAcquire(ctx, "invoice/2", nil)
	require.NoError(t, err, "resources are independent")
	assert.Equal(t, int64(1), other.Token(), "tokens count per resource")

	hs, err := m2.List(ctx, &lease.ListOptions{Resource: "invoice/1"})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, "one", hs[0].Owner)
	assert.JSONEq(t, `{"why":"test"}`, string(hs[0].Metadata))
	assert.False(t, hs[0].Expired)

	before := a.ExpiresAt()
	require.NoError(t, a.Renew(ctx))
	assert.True(t, a.ExpiresAt().After(before))
	require.NoError(t, a.Release(ctx))
	require.ErrorIs(t, a.Release(ctx), lease.ErrLeaseLost)
	require.ErrorIs(t, a.Renew(ctx), lease.ErrLeaseLost)

	b, err := m2.TryAcquire(ctx, "invoice/1", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2), b.Token())
	require.ErrorIs(t, a.Release(ctx), lease.ErrLeaseLost, "a stale handle cannot release the new lease")
	require.NoError(t, b.Release(ctx))
	require.NoError(t, other.Release(ctx))
}

func TestManagerShared(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute})
	shared := &lease.AcquireOptions{Mode: lease.Shared}

	r1, err := m1.TryAcquire(ctx, "doc", shared)
	require.NoError(t, err)
	r2, err := m2.TryAcquire(ctx, "doc", shared)
	require.NoError(t, err, "readers share")
	assert.Greater(t, r2.Token(), r1.Token(), "every acquisition gets its own token, shared ones too")
	_, err = m1.TryAcquire(ctx, "doc", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "a writer is excluded by readers")

	require.NoError(t, r1.Release(ctx))
	_, err = m1.TryAcquire(ctx, "doc", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "one reader is enough to exclude")
	require.NoError(t, r2.Release(ctx))
	w, err := m1.TryAcquire(ctx, "doc", nil)
	require.NoError(t, err)
	assert.Greater(t, w.Token(), r2.Token())
	require.NoError(t, w.Release(ctx))
}

func TestManagerBlockingAcquireWakesOnRelease(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	// A poll interval far beyond the test's patience: only NOTIFY can wake the waiter in time.
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})

	held, err := m1.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	got := make(chan *lease.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := m2.Acquire(ctx, "r", nil)
		got <- l
		errc <- err
	}()
	// Wait until the waiter listens (database state), then release. (A
	// writer blocked by a writer stores no intent: see the package docs.)
	resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
	waitForListener(t, p2, p1)
	start := time.Now()
	require.NoError(t, held.Release(ctx))
	l := <-got
	require.NoError(t, <-errc)
	t.Logf("waiter acquired %v after the release", time.Since(start))
	// The event, on the database's clock: the waiter got in before the released lease
	// would have expired, which (with a poll interval of an hour) only NOTIFY can do.
	assert.True(t, l.AcquiredAt().Before(held.ExpiresAt()), "acquired at %v, the released lease expired at %v", l.AcquiredAt(), held.ExpiresAt())
	assert.Greater(t, l.Token(), held.Token())
	assert.False(t, queryOne[bool](t, p1, "SELECT writer_intent IS NOT NULL FROM "+resources+" WHERE resource = 'r'"),
		"a granted writer clears its intent")
	require.NoError(t, l.Release(ctx))
	assert.Zero(t, p2.Stat().AcquiredConns(), "the LISTEN connection went back to the pool")
	assertNoListeners(t, p2)
}

// assertNoListeners checks that no idle connection of the pool is still
// subscribed to a channel: the waiting connection went back clean.
func assertNoListeners(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := testCtx(t)
	conns := pool.AcquireAllIdle(ctx)
	require.NotEmpty(t, conns)
	for _, c := range conns {
		n := -1
		require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM pg_listening_channels()").Scan(&n))
		assert.Zero(t, n, "a pooled connection is still listening")
		c.Release()
	}
}

func TestManagerAcquireRespectsContext(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 20 * time.Millisecond})
	held, err := m1.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = m2.Acquire(wctx, "r", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
	assert.False(t, queryOne[bool](t, p1, "SELECT writer_intent IS NOT NULL FROM "+resources+" WHERE resource = 'r'"),
		"an abandoned wait clears its intent")
	hs, err := m1.List(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, hs, 1, "the abandoned wait left no lease behind")
	assert.Zero(t, p2.Stat().AcquiredConns())
	require.NoError(t, held.Release(ctx))
}

func TestManagerExpiryTakeover(t *testing.T) {
	const ttl = 400 * time.Millisecond
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: ttl})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: ttl, PollInterval: 50 * time.Millisecond})

	old, err := m1.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	// The blocking acquire sleeps until the database says the old lease expires.
	taken, err := m2.Acquire(ctx, "r", nil)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, taken.AcquiredAt().Sub(old.AcquiredAt()), ttl, "by the database clock")
	assert.Greater(t, taken.Token(), old.Token())

	require.ErrorIs(t, old.Renew(ctx), lease.ErrLeaseLost)
	require.ErrorIs(t, old.Release(ctx), lease.ErrLeaseLost)
	hs, err := m1.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, taken.Token(), hs[0].Token, "the old holder's calls did not touch the new lease")
	require.NoError(t, taken.Renew(ctx))
	require.NoError(t, taken.Release(ctx))
}

func TestManagerSweepAndReleaseAll(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute, Owner: "worker-1"})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, Owner: "worker-2"})

	short := &lease.AcquireOptions{TTL: 100 * time.Millisecond}
	for _, r := range []string{"a", "b"} {
		_, err := m1.TryAcquire(ctx, r, short)
		require.NoError(t, err)
	}
	for _, r := range []string{"c", "d"} {
		_, err := m1.TryAcquire(ctx, r, nil)
		require.NoError(t, err)
	}
	kept, err := m2.TryAcquire(ctx, "e", nil)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		hs, err := m1.List(ctx, &lease.ListOptions{IncludeExpired: true, Owner: "worker-1"})
		require.NoError(t, err)
		n := 0
		for _, h := range hs {
			if h.Expired {
				n++
			}
		}
		return n == 2
	}, 10*time.Second, 10*time.Millisecond)
	live, err := m1.List(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, live, 3, "List hides expired leases by default")

	n, err := m2.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	n, err = m2.ReleaseAll(ctx, "worker-1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	all, err := m1.List(ctx, &lease.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	require.Len(t, all, 1)
	assert.Equal(t, "worker-2", all[0].Owner)
	assert.Contains(t, all[0].String(), `"e" exclusive token=1 owner="worker-2" live`)
	_, err = m1.ReleaseAll(ctx, "")
	require.ErrorIs(t, err, lease.ErrInvalid)
	require.NoError(t, kept.Release(ctx))
}

func TestManagerConcurrentMigrate(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		pool := p1
		if i%2 == 1 {
			pool = p2
		}
		wg.Go(func() {
			m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Second})
			if err == nil {
				err = m.Migrate(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, 2, queryOne[int](t, p1, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema))
}

func TestManagerValidation(t *testing.T) {
	p1 := pgtest.Pool(t)
	ctx := testCtx(t)
	for name, cfg := range map[string]lease.ManagerConfig{
		"zero TTL":        {},
		"long table":      {TTL: time.Second, Table: strings.Repeat("t", 54)},
		"NUL table":       {TTL: time.Second, Table: "a\x00b"},
		"bad channel":     {TTL: time.Second, Channel: strings.Repeat("c", 64)},
		"tiny poll":       {TTL: time.Second, PollInterval: time.Microsecond},
		"NUL owner":       {TTL: time.Second, Owner: "x\x00"},
		"negative bounds": {TTL: time.Second, ReleaseTimeout: -time.Second},
	} {
		_, err := lease.NewManager(p1, cfg)
		require.ErrorIs(t, err, lease.ErrInvalid, name)
	}
	m, err := lease.NewManager(p1, lease.ManagerConfig{TTL: time.Second, Table: strings.Repeat("t", 51)})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		resource string
		opts     *lease.AcquireOptions
	}{
		"empty resource":    {"", nil},
		"long resource":     {strings.Repeat("r", lease.MaxResourceLen+1), nil},
		"NUL resource":      {"a\x00", nil},
		"invalid UTF-8":     {"\xff\xfe", nil},
		"negative TTL":      {"r", &lease.AcquireOptions{TTL: -time.Second}},
		"unknown mode":      {"r", &lease.AcquireOptions{Mode: 7}},
		"metadata not JSON": {"r", &lease.AcquireOptions{Metadata: json.RawMessage(`{`)}},
	} {
		_, err := m.TryAcquire(ctx, tc.resource, tc.opts)
		require.ErrorIs(t, err, lease.ErrInvalid, name)
		_, err = m.Acquire(ctx, tc.resource, tc.opts)
		require.ErrorIs(t, err, lease.ErrInvalid, name)
	}
	assert.Equal(t, "shared", lease.Shared.String())
	assert.Equal(t, "Mode(7)", lease.Mode(7).String())
}
