package lease_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Review round 13. NewFence: "a dotted table name ... is reported as
// ErrInvalid before any SQL is sent", as NewColumn and NewManager do.
func TestNewFenceRefusesADottedTable(t *testing.T) {
	_, err := lease.NewFence(lease.FenceConfig{Table: "public.accounts"})
	require.ErrorIs(t, err, lease.ErrInvalid)
	assert.Contains(t, err.Error(), "Schema field")
}

// Review round 13. An operator pins a lease for good by editing its row to
// expires_at = 'infinity'. It is a live lease: TryAcquire is refused with
// ErrNotAcquired (it failed with 22008 "cannot subtract infinite
// timestamps" computing the retry hint), Acquire waits until ctx ends, and
// List shows it as documented on Holder.ExpiresAt (it failed with 0A000
// for the whole table). '-infinity' is an expired lease, taken over. A
// writer intent edited to 'infinity' blocks readers and is listed.
func TestHandEditedInfiniteTimes(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 20 * time.Millisecond})
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()

	_, err := m.TryAcquire(ctx, "pinned", nil)
	require.NoError(t, err)
	mustExec(t, p1, "UPDATE "+holders+" SET expires_at = 'infinity' WHERE resource = 'pinned'")

	_, err = m.TryAcquire(ctx, "pinned", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "a lease held until infinity is live")
	_, err = m.TryAcquire(ctx, "pinned", &lease.AcquireOptions{Mode: lease.Shared})
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = m.Acquire(actx, "pinned", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "Acquire waits, then gives up with ctx")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	hs, err := m.List(ctx, &lease.ListOptions{Resource: "pinned"})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.True(t, hs[0].ExpiresAt.Equal(time.UnixMicro(math.MaxInt64)), "ExpiresAt %v", hs[0].ExpiresAt)
	assert.False(t, hs[0].Expired)
	assert.Contains(t, hs[0].String(), "294247")

	mustExec(t, p1, "UPDATE "+holders+" SET expires_at = '-infinity', acquired_at = '-infinity' WHERE resource = 'pinned'")
	hs, err = m.List(ctx, &lease.ListOptions{Resource: "pinned", IncludeExpired: true})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.True(t, hs[0].ExpiresAt.Equal(time.UnixMicro(math.MinInt64)), "ExpiresAt %v", hs[0].ExpiresAt)
	assert.True(t, hs[0].AcquiredAt.Equal(time.UnixMicro(math.MinInt64)), "AcquiredAt %v", hs[0].AcquiredAt)
	assert.True(t, hs[0].Expired)
	l, err := m.TryAcquire(ctx, "pinned", nil)
	require.NoError(t, err, "a lease that expired at -infinity is taken over")
	require.NoError(t, l.Release(ctx))

	// A writer's intent edited to last for ever.
	mustExec(t, p1, "UPDATE "+resources+" SET writer_intent = 'by-hand', writer_intent_until = 'infinity' WHERE resource = 'pinned'")
	_, err = m.TryAcquire(ctx, "pinned", &lease.AcquireOptions{Mode: lease.Shared})
	require.ErrorIs(t, err, lease.ErrNotAcquired, "the intent refuses readers")
	in, err := m.ListIntents(ctx, nil)
	require.NoError(t, err)
	require.Len(t, in, 1)
	assert.True(t, in[0].Until.Equal(time.UnixMicro(math.MaxInt64)), "Until %v", in[0].Until)
	assert.False(t, in[0].Expired)
}

// Review round 13. ManagerConfig.PollInterval: "A waiting writer's intent
// lasts 3*PollInterval": a PollInterval over a third of time.Duration's
// range wrapped 3*PollInterval negative, so the intent was stored already
// expired and a new reader got in ahead of the waiting writer.
func TestHugePollIntervalKeepsTheWritersIntent(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	huge := 100 * 365 * 24 * time.Hour
	require.Less(t, 3*huge, time.Duration(0), "the interval wraps when tripled")
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: huge})

	reader, err := m1.TryAcquire(ctx, "doc", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := m2.Acquire(wctx, "doc", nil)
		done <- err
	}()
	var intents []lease.Intent
	require.Eventually(t, func() bool {
		intents, err = m1.ListIntents(ctx, &lease.ListOptions{IncludeExpired: true})
		require.NoError(t, err)
		return len(intents) == 1
	}, 20*time.Second, 5*time.Millisecond, "the blocked writer stores its intent")
	assert.False(t, intents[0].Expired, "the intent lasts: %v", intents[0])
	_, err = m1.TryAcquire(ctx, "doc", &lease.AcquireOptions{Mode: lease.Shared})
	require.ErrorIs(t, err, lease.ErrNotAcquired, "a new reader is refused while the writer waits")

	cancel()
	require.ErrorIs(t, <-done, lease.ErrNotAcquired)
	require.NoError(t, reader.Release(ctx))
}

// Review round 13. A pool whose connections run with client_encoding
// LATIN1 (ALTER ROLE ... SET client_encoding, a LATIN1 database's default,
// or as here the connection's runtime parameters: pgx does not override
// any) read the UTF-8 bytes pgx sends for "café" as "cafÃ©", so it took a
// second exclusive lease of the resource another pool held. Every lease
// statement now runs with client_encoding UTF8 for its transaction: the
// LATIN1 pool is refused, sees the one holder in List, takes the lease once
// it is free, and leaves its connections in LATIN1.
func TestNonUTF8ClientEncodingSeesTheSameNames(t *testing.T) {
	ctx := testCtx(t)
	utf8 := pgtest.Pool(t)
	schema := pgtest.Schema(t, utf8)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "LATIN1"
	cfg.MaxConns = 1
	latin1 := pgtest.NewPool(t, cfg)
	showEnc := func() string {
		var enc string
		require.NoError(t, latin1.QueryRow(ctx, "SHOW client_encoding").Scan(&enc))
		return enc
	}
	require.Equal(t, "LATIN1", showEnc(), "the pool really runs in LATIN1")

	mu := newManager(t, utf8, schema, lease.ManagerConfig{TTL: time.Minute})
	ml, err := lease.NewManager(latin1, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	held, err := mu.TryAcquire(ctx, "café", nil)
	require.NoError(t, err)

	_, err = ml.TryAcquire(ctx, "café", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired, "no second holder of café")
	hs, err := ml.List(ctx, &lease.ListOptions{Resource: "café"})
	require.NoError(t, err)
	require.Len(t, hs, 1, "the filter and the name read back are UTF-8")
	assert.Equal(t, "café", hs[0].Resource)
	assert.Equal(t, held.Token(), hs[0].Token)
	_, err = ml.ListIntents(ctx, nil)
	require.NoError(t, err)
	var n int
	require.NoError(t, utf8.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, lease.DefaultTable}.Sanitize()).Scan(&n))
	assert.Equal(t, 1, n, "one holder row")

	require.NoError(t, held.Release(ctx))
	mine, err := ml.TryAcquire(ctx, "café", nil)
	require.NoError(t, err)
	assert.Equal(t, "café", mine.Resource())
	hs, err = mu.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, "café", hs[0].Resource, "stored as the UTF8 pool names it")
	require.NoError(t, mine.Release(ctx))
	assert.Equal(t, "LATIN1", showEnc(), "the connection's own encoding is left as it was")

	usersTable(t, utf8, schema, time.Minute, 1)
	cl, err := lease.NewColumn(latin1, usersConfig(schema, time.Minute))
	require.NoError(t, err)
	l, err := cl.TryAcquire(ctx, int64(1))
	require.NoError(t, err, "column leases too")
	require.NoError(t, l.Release(ctx))
}

// panicRenewTracer panics in every TraceRenew, after telling renewed.
type panicRenewTracer struct{ renewed chan struct{} }

func (p panicRenewTracer) TraceRenew(context.Context, lease.TraceRenewData) {
	select {
	case p.renewed <- struct{}{}:
	default:
	}
	panic("tracer bug")
}

// A RenewTracer that panics (found for advisory's tracers by review round
// 13) must not end the process from Do's background renewal goroutine, nor
// unwind a caller's Renew: it is recovered and logged.
func TestRenewTracerPanicIsRecovered(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	tr := panicRenewTracer{renewed: make(chan struct{}, 1)}
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Second, Tracer: tr})
	err := m.Do(ctx, "job", &lease.DoOptions{RenewEvery: 50 * time.Millisecond}, func(ctx context.Context, l *lease.Lease) error {
		select {
		case <-tr.renewed: // a background renewal reached the tracer
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return l.Renew(ctx) // and a renewal of the caller's own
	})
	require.NoError(t, err, "Do and its renewals went on")
}

// Review round 14: a finite time past the year 294247 (PostgreSQL's
// timestamptz reaches 294276) overflowed List's int8 microseconds (22003)
// for the whole table; it reads as the largest time, as 'infinity' does.
func TestTimesPastUnixMicrosRange(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
	_, err := m.TryAcquire(ctx, "far", nil)
	require.NoError(t, err)
	mustExec(t, p1, "UPDATE "+holders+" SET expires_at = '294276-12-31 23:59:59+00' WHERE resource = 'far'")
	mustExec(t, p1, "UPDATE "+resources+" SET writer_intent = 'w', writer_intent_until = '294270-01-01 00:00:00+00' WHERE resource = 'far'")
	hs, err := m.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.True(t, hs[0].ExpiresAt.Equal(time.UnixMicro(math.MaxInt64)), "ExpiresAt %v", hs[0].ExpiresAt)
	in, err := m.ListIntents(ctx, nil)
	require.NoError(t, err)
	require.Len(t, in, 1)
	assert.True(t, in[0].Until.Equal(time.UnixMicro(math.MaxInt64)), "Until %v", in[0].Until)
	_, err = m.TryAcquire(ctx, "far", nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired)
}

// Review round 14: on a database whose encoding is not UTF8, the release's
// NOTIFY payload was md5 of the resource's bytes in that encoding, which
// the waiters (md5 of the UTF-8 bytes) never matched: a waiter on a
// non-ASCII resource was not woken, only polled. The payload hashes the
// UTF-8 bytes now (convert_to).
func TestReleaseWakesWaiterOnALatin1Database(t *testing.T) {
	ctx := testCtx(t)
	cfg := latin1Database(t, "l1wake")
	for _, enc := range []string{"UTF8", "LATIN1"} {
		t.Run("client_encoding "+enc, func(t *testing.T) {
			c := cfg.Copy()
			c.ConnConfig.RuntimeParams["client_encoding"] = enc
			pool := pgtest.NewPool(t, c)
			m, err := lease.NewManager(pool, lease.ManagerConfig{Table: "wake_" + strings.ToLower(enc), TTL: time.Minute, PollInterval: 10 * time.Minute})
			require.NoError(t, err)
			require.NoError(t, m.Migrate(ctx))
			// A shared holder, so that the waiting writer's intent shows it waits.
			held, err := m.TryAcquire(ctx, "café", &lease.AcquireOptions{Mode: lease.Shared})
			require.NoError(t, err)
			woken := make(chan error, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // far below the 10 min poll and the 1 min TTL
				defer cancel()
				l, err := m.Acquire(wctx, "café", nil)
				if err == nil {
					err = l.Release(ctx)
				}
				woken <- err
			}()
			require.Eventually(t, func() bool {
				in, err := m.ListIntents(ctx, nil)
				return err == nil && len(in) == 1
			}, 20*time.Second, 5*time.Millisecond, "the waiter is waiting")
			require.NoError(t, held.Release(ctx))
			require.NoError(t, <-woken, "the release's NOTIFY woke the waiter")
		})
	}
}

// The package doc: in QueryExecModeSimpleProtocol pgx itself refuses a
// session whose client_encoding is not UTF8, before anything is sent; the
// lease call returns pgx's error.
func TestSimpleProtocolNeedsUTF8ClientEncoding(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	newManager(t, admin, schema, lease.ManagerConfig{TTL: time.Minute})
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "LATIN1"
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // not pgtest.NewPool: its leak check would run in this pool's mode too
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	_, err = m.TryAcquire(ctx, "café", nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "client_encoding=UTF8")
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*)::int FROM "+pgx.Identifier{schema, lease.DefaultTable}.Sanitize()).Scan(&n))
	assert.Zero(t, n, "nothing acquired")
}
