package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// ListLocks reads its times whatever the session's DateStyle, in every exec mode, to the
// microsecond. Before, under DateStyle = 'SQL, DMY' in the Exec and simple protocol modes
// (where pgx reads results as text and parses timestamps in the ISO style only), it failed.
func TestListLocksUnderAnotherDateStyle(t *testing.T) {
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			cfg := pgtest.Config(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.RuntimeParams["DateStyle"] = "SQL, DMY"
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			k := key(t)
			h, err := l.Lock(ctx, k, nil)
			require.NoError(t, err)
			defer h.Unlock(ctx) //nolint:errcheck
			waiterDone := make(chan error, 1)
			wctx, cancelWaiter := context.WithCancel(ctx)
			go func() {
				waiterDone <- l.WithLock(wctx, k, nil, func(context.Context, *pgx.Conn) error { return nil })
			}()
			plain := pgtest.Pool(t)
			awaitWaiting(ctx, t, plain, k, 1)

			infos, err := advisory.ListLocks(ctx, pool, k)
			require.NoError(t, err)
			require.Len(t, infos, 2)
			for _, li := range infos {
				var backend time.Time
				require.NoError(t, plain.QueryRow(ctx, "SELECT backend_start FROM pg_stat_activity WHERE pid = $1", li.PID).Scan(&backend))
				assert.True(t, li.BackendStart.Equal(backend), "backend_start %v, pg_stat_activity %v", li.BackendStart, backend)
			}
			require.False(t, infos[1].Granted)
			var wait time.Time
			require.NoError(t, plain.QueryRow(ctx, "SELECT waitstart FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype = 'advisory'", infos[1].PID).Scan(&wait))
			assert.True(t, infos[1].WaitStart.Equal(wait), "waitstart")
			cancelWaiter()
			require.Error(t, <-waiterDone)
		})
	}
}
