package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/pooltx"
)

// Review round 12: the first pin/lend of a connection costs one round trip once;
// a later call its documented count (empty-callback WithLock: 2 as raw;
// WithXactLock 2; pooltx.WithConn with a statement: statement + reset).
func TestFirstUseRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			var rt roundtrip.Counter
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DialFunc = rt.DialFunc
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			require.NoError(t, l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil })) // per-Locker check, first lend
			calls := map[string]func() error{
				"WithLock empty": func() error {
					return l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil })
				},
				"WithXactLock empty": func() error {
					return l.WithXactLock(ctx, key(t), nil, func(context.Context, pgx.Tx) error { return nil })
				},
				"WithLock SELECT 1": func() error {
					return l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error { _, err := c.Exec(ctx, "SELECT 1"); return err })
				},
				"pooltx.WithConn SELECT 1": func() error {
					return pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error { _, err := c.Conn().Exec(ctx, "SELECT 1"); return err })
				},
			}
			for name, call := range calls {
				// warm (prepare statements), then fresh connection: first vs steady
				require.NoError(t, call())
				require.NoError(t, call())
				rt.Reset()
				require.NoError(t, call())
				steady := rt.Reset()
				pool.Reset()
				require.NoError(t, pool.Ping(ctx))
				rt.Reset()
				require.NoError(t, call())
				first := rt.Reset()
				t.Logf("%s: steady %d, first on a fresh connection %d", name, steady, first)
				if mode == pgx.QueryExecModeCacheStatement {
					continue // a fresh connection re-prepares pgx's statements
				}
				assert.Equal(t, steady+1, first, "%s: first use costs one round trip more", name)
			}
		})
	}
}
