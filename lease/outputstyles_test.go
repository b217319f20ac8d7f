package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// styledPool is a pool in mode whose sessions use output styles other than PostgreSQL's
// defaults: dates as SQL, day first; intervals as the SQL standard; floats with 15 digits
// fewer. In the Exec and simple protocol modes pgx reads results as text, and parses
// timestamps and intervals in the default styles only.
func styledPool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg := pgtest.Config(t)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.RuntimeParams["DateStyle"] = "SQL, DMY"
	cfg.ConnConfig.RuntimeParams["IntervalStyle"] = "sql_standard"
	cfg.ConnConfig.RuntimeParams["extra_float_digits"] = "-15"
	return pgtest.NewPool(t, cfg)
}

// Every lease call works whatever the session's DateStyle, IntervalStyle and
// extra_float_digits, in every exec mode, and List and ListIntents report the times the
// table holds, to the microsecond. Before, under DateStyle = 'SQL, DMY' in the Exec and
// simple protocol modes, every acquisition failed reading back its own timestamps (after
// its transaction had committed), and so did List.
func TestOutputStylesDoNotBreakLeases(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			plain, _, schema := twoPools(t)
			pool := styledPool(t, mode)
			newManager(t, plain, schema, lease.ManagerConfig{TTL: time.Minute})
			m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
			require.NoError(t, err)

			l, err := m.TryAcquire(ctx, "r", &lease.AcquireOptions{Mode: lease.Shared})
			require.NoError(t, err)
			require.NoError(t, l.Renew(ctx))
			hs, err := m.List(ctx, nil)
			require.NoError(t, err)
			require.Len(t, hs, 1)
			holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
			assert.True(t, hs[0].AcquiredAt.Equal(queryOne[time.Time](t, plain, "SELECT acquired_at FROM "+holders)), "acquired_at")
			assert.True(t, hs[0].ExpiresAt.Equal(queryOne[time.Time](t, plain, "SELECT expires_at FROM "+holders)), "expires_at")

			// A writer waits behind the reader: its intent is listed.
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := m.Acquire(wctx, "r", &lease.AcquireOptions{Mode: lease.Exclusive})
				done <- err
			}()
			var ins []lease.Intent
			require.Eventually(t, func() bool {
				ins, err = m.ListIntents(ctx, nil)
				require.NoError(t, err)
				return len(ins) == 1
			}, 20*time.Second, 5*time.Millisecond, "the blocked writer's intent is listed")
			// The waiting writer refreshes its intent: the listed time is the one
			// read just before or just after.
			resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
			untilSQL := "SELECT writer_intent_until FROM " + resources
			before := queryOne[time.Time](t, plain, untilSQL)
			ins, err = m.ListIntents(ctx, nil)
			require.NoError(t, err)
			require.Len(t, ins, 1)
			after := queryOne[time.Time](t, plain, untilSQL)
			assert.True(t, ins[0].Until.Equal(before) || ins[0].Until.Equal(after), "writer_intent_until %v, table %v then %v", ins[0].Until, before, after)
			cancel()
			require.ErrorIs(t, <-done, lease.ErrNotAcquired)
			require.NoError(t, l.Release(ctx))

			require.NoError(t, m.TryDo(ctx, "r", nil, func(context.Context, *lease.Lease) error { return nil }))

			usersTable(t, plain, schema, time.Minute, 1)
			c, err := lease.NewColumn(pool, usersConfig(schema, time.Minute))
			require.NoError(t, err)
			columnCycle(ctx, t, c, 1)
		})
	}
}
