package pooltx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// onePool is a pool of one connection, in pgx's default exec mode (its
// statement cache in use, so the reset carries its probe).
func onePool(t *testing.T) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement // whatever the DSN says
	return pgtest.NewPool(t, cfg)
}

// role creates a role the test's superuser may SET ROLE to, dropped at cleanup.
func role(ctx context.Context, t *testing.T, p *pgxpool.Pool) string {
	r := fmt.Sprintf("pgxlock_t19_%d", pgtest.UniqueInt32(t)&0x7fffffff)
	_, err := p.Exec(ctx, "CREATE ROLE "+r)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+r) })
	return r
}

// The reset's probe runs before the reset, so a statement prepared under
// its name by the lent code (here: one that takes a session lock and
// switches role) is undone by the reset that follows it. Before, the probe
// stood in for the reset's unlock, and the next borrower had the role and
// the lock.
func TestResetUndoesWhatAStatementPreparedUnderTheProbesNameDid(t *testing.T) {
	ctx := testCtx(t)
	p := onePool(t)
	r := role(ctx, t, p)
	k := pgtest.UniqueInt64(t)
	var pid uint32
	require.NoError(t, pooltx.WithConn(ctx, p, nil, func(ctx context.Context, c *pooltx.Conn) error {
		pid = c.Conn().PgConn().PID()
		_, err := c.Conn().Exec(ctx, fmt.Sprintf("DEALLOCATE pgxlock_reset; PREPARE pgxlock_reset AS SELECT pg_advisory_lock(%d), set_config('role', '%s', false)", k, r))
		return err
	}))
	var user string
	var locks int
	var next uint32
	require.NoError(t, p.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		next = c.Conn().PgConn().PID()
		return c.QueryRow(ctx, "SELECT current_user::text, (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())").Scan(&user, &locks)
	}))
	require.Equal(t, pid, next, "the same backend, not a new one")
	assert.NotEqual(t, r, user)
	assert.Zero(t, locks)
}

// Notifications pgx received for the lent code's LISTEN never reach the
// next borrower: the reset ends the registrations, and Release drops what
// had already arrived. Before, the next borrower's WaitForNotification
// returned the other borrower's notification first.
func TestNotificationsOfTheLentCodeNeverReachTheNextBorrower(t *testing.T) {
	ctx := testCtx(t)
	p := onePool(t)
	require.NoError(t, pooltx.WithConn(ctx, p, nil, func(ctx context.Context, c *pooltx.Conn) error {
		// A session gets its own notifications at commit, before the
		// statement's answer: pgx has queued it when Exec returns.
		_, err := c.Conn().Exec(ctx, "LISTEN tenant_b; NOTIFY tenant_b, 'secret of b'")
		return err
	}))
	require.NoError(t, p.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		if _, err := c.Exec(ctx, "LISTEN tenant_a; NOTIFY tenant_a, 'mine'"); err != nil {
			return err
		}
		n, err := c.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		assert.Equal(t, "tenant_a", n.Channel)
		assert.Equal(t, "mine", n.Payload)
		_, err = c.Exec(ctx, "UNLISTEN *")
		return err
	}))
}

// A callback that resets its connection itself and then does more work
// does not vouch for it: WithConn resets after the callback whatever it
// did. Before, the callback's Reset marked the connection clean, and the
// SET ROLE after it reached the next borrower.
func TestWithConnResetsAfterTheCallbackWhateverItCalled(t *testing.T) {
	ctx := testCtx(t)
	p := onePool(t)
	r := role(ctx, t, p)
	require.NoError(t, pooltx.WithConn(ctx, p, nil, func(ctx context.Context, c *pooltx.Conn) error {
		if err := c.Reset(ctx); err != nil {
			return err
		}
		_, err := c.Conn().Exec(ctx, "SET ROLE "+pgx.Identifier{r}.Sanitize())
		return err
	}))
	var user string
	require.NoError(t, p.QueryRow(ctx, "SELECT current_user::text").Scan(&user))
	assert.NotEqual(t, r, user)
}
