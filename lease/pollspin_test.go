package lease_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// batchCounter counts the batches and queries a pool sends.
type batchCounter struct{ n atomic.Int64 }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (*batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (*batchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// ManagerConfig.PollInterval's doc: each wait between attempts is in
// [PollInterval/2, PollInterval], shortened to the earliest blocker's
// expiry. Review 22: behind a blocker whose expiry is beyond
// time.Duration's range (TTL = MaxInt64 through the API, or a row edited to
// a far future) the saturated hint plus its jitter wrapped negative, and a
// blocking Acquire retried at once, thousands of times a second, for as
// long as its context allowed. With an hour's PollInterval, no release and
// no notification, the first attempt is the only one before the deadline.
func TestAcquireBehindAFarFutureExpiryWaitsItsPollInterval(t *testing.T) {
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	ctx := testCtx(t)
	tr := &batchCounter{}
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Tracer = tr
	pool := pgtest.NewPool(t, cfg)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Second, PollInterval: time.Hour})
	for _, how := range []string{"ttl", "edited"} {
		t.Run(how, func(t *testing.T) {
			res := "r-" + how
			var blocker *lease.Lease
			var err error
			if how == "ttl" {
				blocker, err = m.TryAcquire(ctx, res, &lease.AcquireOptions{TTL: time.Duration(math.MaxInt64)})
				require.NoError(t, err)
			} else {
				blocker, err = m.TryAcquire(ctx, res, &lease.AcquireOptions{TTL: time.Minute})
				require.NoError(t, err)
				mustExec(t, admin, "UPDATE "+pgx.Identifier{schema, "pgxlock_leases"}.Sanitize()+
					" SET expires_at = now() + interval '1000 years' WHERE resource = $1", res)
			}
			tr.n.Store(0)
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = m.Acquire(actx, res, nil)
			cancel()
			require.ErrorIs(t, err, lease.ErrNotAcquired)
			// The attempt, its writer intent's give-back and its LISTEN: a
			// handful of statements, not one per millisecond.
			assert.LessOrEqual(t, tr.n.Load(), int64(8), "statements sent by one blocked Acquire")
			require.NoError(t, blocker.Release(ctx))
		})
	}
}
