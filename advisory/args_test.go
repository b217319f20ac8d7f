package advisory_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// TestOneKeyArgumentsEveryExecMode: a one-key call's arguments (the key,
// as an int8 or an int4 pair, and the lock_timeout text of a call with a
// deadline) reach the server intact in every pgx query exec mode, extremes
// of each key space included: the lock the call holds is the one another
// session finds busy.
func TestOneKeyArgumentsEveryExecMode(t *testing.T) {
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	base := pgtest.UniqueInt64(t)
	ks := []keys.Key{keys.Int64(base), keys.Int64(math.MinInt64 + base%1000), keys.Int64(math.MaxInt64 - base%1000),
		keys.Pair(math.MinInt32, int32(base%1000)), keys.Pair(int32(base%1000), math.MaxInt32)}
	p := newProbe(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			l := newLocker(t, pgtest.NewPool(t, cfg), advisory.Config{})
			dl, cancel := context.WithTimeout(testCtx(t), time.Minute) // a deadline: lock_timeout as text
			defer cancel()
			for _, k := range ks {
				busy := func(context.Context, *pgx.Conn) error {
					require.False(t, p.free(dl, k, false), "%v held", k)
					return nil
				}
				require.NoError(t, l.WithLock(dl, k, nil, busy))
				require.NoError(t, l.WithLock(context.Background(), k, nil, busy))
				require.NoError(t, l.TryWithLock(dl, k, nil, busy))
				require.NoError(t, l.WithLock(dl, k, &advisory.Options{Shared: true}, func(context.Context, *pgx.Conn) error {
					require.False(t, p.free(dl, k, false), "%v held shared", k)
					require.True(t, p.free(dl, k, true), "%v shared: another shared holder fits", k)
					return nil
				}))
				require.NoError(t, l.WithXactLock(dl, k, nil, func(context.Context, pgx.Tx) error {
					require.False(t, p.free(dl, k, false), "%v held in the transaction", k)
					return nil
				}))
				h, err := l.Lock(dl, k, nil)
				require.NoError(t, err)
				require.False(t, p.free(dl, k, false), "%v held by the handle", k)
				require.NoError(t, h.Unlock(dl))
				require.True(t, p.free(dl, k, false), "%v free after each call", k)
			}
		})
	}
}
