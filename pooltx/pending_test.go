package pooltx_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

var allExecModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// SendReset's doc: any method of c that sends reads a pending reset's answers first,
// SendReset and ExecBoundedThenReset included. Without that (review 20), a second reset
// sent behind a first left one reset's answers unread: Release read the other's, marked the
// connection clean and handed the next borrower answers that were not its own (its
// SELECT 42 found no rows, in the exec and simple protocol modes), and a second
// ExecBoundedThenReset read the first one's reset as its statement's answer.
func TestOnePendingResetAtATime(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool := pgtest.NewPool(t, cfg)
			next := func(what string) {
				t.Helper()
				var v int
				require.NoError(t, pool.QueryRow(ctx, "SELECT 42").Scan(&v), what)
				assert.Equal(t, 42, v, what)
			}

			c, err := pooltx.Acquire(ctx, pool, nil)
			require.NoError(t, err)
			require.NoError(t, c.SendReset())
			require.NoError(t, c.SendReset())
			assert.False(t, c.Release(), "both resets answered: the connection is kept")
			next("after SendReset twice")

			c, err = pooltx.Acquire(ctx, pool, nil)
			require.NoError(t, err)
			for _, want := range []string{"first", "second"} {
				var rows []string
				n, err := c.ExecBoundedThenReset("SELECT '"+want+"'", func(v [][]byte) { rows = append(rows, string(v[0])) })
				require.NoError(t, err)
				assert.Equal(t, 1, n, want)
				assert.Equal(t, []string{want}, rows, "each call reads its own statement's answer")
			}
			require.NoError(t, c.SendReset())
			assert.False(t, c.Release())
			next("after ExecBoundedThenReset twice and SendReset")
		})
	}
}

// releaseTracer is a pool tracer that counts TraceRelease calls.
type releaseTracer struct{ releases atomic.Int64 }

func (r *releaseTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (r *releaseTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *releaseTracer) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData)            { r.releases.Add(1) }

// ReleaseAsync's doc: a pool that traces releases is released before ReleaseAsync
// returns, as Release releases, so that a release tracer's panic reaches the caller, as
// with pgxpool's own Release: pgxpool calls that tracer after it has let go of the
// connection and before it gives the slot back, and a panic recovered in a background
// release (review 20) was dropped while the pool of one wedged silently (Acquire timed
// out, Close hung). Shown with a reset that waits for a lock the test holds (a statement
// planted under the probe's name): WithConn must not return before its release has been
// traced. Before, it returned while the reset waited, its release not traced yet.
func TestPoolThatTracesReleasesIsReleasedBeforeTheCallReturns(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	x := pgtest.UniqueInt64(t)
	blocker, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer blocker.Release()
	_, err = blocker.Exec(ctx, "SELECT pg_advisory_lock($1)", x)
	require.NoError(t, err)
	unblocked := false
	unblock := func() {
		if !unblocked {
			unblocked = true
			_, err := blocker.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", x)
			require.NoError(t, err)
		}
	}
	defer unblock()

	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	tr := &releaseTracer{}
	cfg.ConnConfig.Tracer = tr
	pool := pgtest.NewPool(t, cfg)
	app := cfg.ConnConfig.RuntimeParams["application_name"]
	tracedAtReturn := make(chan int64, 1)
	before := tr.releases.Load()
	go func() {
		err := pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			for _, sql := range []string{"DEALLOCATE pgxlock_reset", "PREPARE pgxlock_reset AS SELECT pg_catalog.pg_advisory_lock(" + strconv.FormatInt(x, 10) + ")"} {
				if _, err := c.Conn().Exec(ctx, sql); err != nil {
					return err
				}
			}
			return nil
		})
		assert.NoError(t, err)
		tracedAtReturn <- tr.releases.Load() - before
	}()
	require.Eventually(t, func() bool { // the reset waits for x
		var waiting bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1)", app).Scan(&waiting))
		return waiting
	}, 30*time.Second, 5*time.Millisecond)
	unblock()
	assert.EqualValues(t, 1, <-tracedAtReturn, "the release was traced before WithConn returned")
}
