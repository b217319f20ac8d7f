package pooltx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

func callerTestRole(ctx context.Context, t *testing.T, name string, attrs string) string {
	t.Helper()
	admin := pgtest.Pool(t)
	_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" "+attrs)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	return name
}

// Conn.Tx's doc: "what its caller ran on c before is still reset at
// release", identity included: Acquire records the identity before the
// caller's own statements run (review round 11: the first Lend recorded
// the caller's SET ROLE, and every later reset restored it).
func TestCallersOwnSetRoleBeforeTxIsUndoneAtRelease(t *testing.T) {
	ctx := testCtx(t)
	other := callerTestRole(ctx, t, fmt.Sprintf("pgxlock_cr_o_%d", pgtest.UniqueInt32(t)&0x7fffffff), "")
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	var login string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text").Scan(&login))
	for _, how := range []string{"Tx", "Lend"} {
		c, err := pooltx.Acquire(ctx, pool, nil)
		require.NoError(t, err)
		_, err = c.Conn().Exec(ctx, "SET ROLE "+other) // the caller's own statement
		require.NoError(t, err)
		if how == "Tx" {
			require.NoError(t, c.Tx(ctx, nil, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT 1")
				return err
			}))
		} else {
			_, err = c.Lend(ctx).Exec(ctx, "SELECT 1")
			require.NoError(t, err)
		}
		require.False(t, c.Release(), "kept")
		var cur string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text").Scan(&cur))
		assert.Equal(t, login, cur, "current_user of the next borrower after the caller's SET ROLE then %s then Release", how)
		pool.Reset()
	}
}
