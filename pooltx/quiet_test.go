package pooltx_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// Work that sent nothing on its connection leaves the session as the pool
// gave it out, and the connection goes back without the reset (Reclaim):
// state another borrower left is still there, the backend is the same. Work
// that sent anything is followed by the reset.
func TestQuietWorkGoesBackAsItCame(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, pid := pgtest.AppName(ctx, t, pool)
	require.NotEqual(t, "left-by-another", fresh)
	// The connection's first pin records its settings as it finds them
	// (the reset restores those): pin it before another borrower leaves
	// anything.
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))

	pgtest.LeaveAppName(ctx, t, pool, "left-by-another")
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(context.Context, *pooltx.Conn) error { return nil }))
	name, p := pgtest.AppName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "WithConn, nothing sent: no reset")
	assert.Equal(t, pid, p)

	require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(context.Context, pgx.Tx) error { return nil }))
	name, p = pgtest.AppName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "WithTx, nothing sent: COMMIT alone")
	assert.Equal(t, pid, p)

	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		_, err := c.Conn().Exec(ctx, "SELECT 1")
		return err
	}))
	name, p = pgtest.AppName(ctx, t, pool)
	assert.Equal(t, fresh, name, "WithConn, a statement sent: reset")
	assert.Equal(t, pid, p)

	pgtest.LeaveAppName(ctx, t, pool, "left-by-another")
	require.NoError(t, pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}))
	name, _ = pgtest.AppName(ctx, t, pool)
	assert.Equal(t, fresh, name, "WithTx, a statement sent: reset with COMMIT")
}

// What the work handed pgx's frontend without flushing it counts as sent:
// Reclaim flushes it first, so the reset runs (here it finds the work's
// answer ahead of its own and the connection is destroyed), and the
// work's SET never reaches the next borrower.
func TestUnflushedWorkIsNotQuiet(t *testing.T) {
	ctx := testCtx(t)
	for _, flush := range []bool{false, true} {
		cfg := pgtest.Config(t)
		cfg.MaxConns = 1
		pool := pgtest.NewPool(t, cfg)
		fresh, _ := pgtest.AppName(ctx, t, pool)
		require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(_ context.Context, c *pooltx.Conn) error {
			fe := c.Conn().PgConn().Frontend()
			fe.Send(&pgproto3.Query{String: "SET application_name = 'sneaky'"})
			if flush {
				return fe.Flush() // answers left unread
			}
			return nil
		}))
		name, _ := pgtest.AppName(ctx, t, pool)
		assert.Equal(t, fresh, name, "flushed by the work: %v", flush)
	}
}

// A preamble is the caller's code, not pooltx's: unless the caller vouches
// for it (PreambleChangesNoState), WithTx resets after it even when fn sent
// nothing.
func TestPreambleIsResetUnlessVouchedFor(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, _ := pgtest.AppName(ctx, t, pool)
	opts := &pooltx.TxOptions{Preamble: func(b *pgx.Batch) {
		b.Queue("SELECT set_config('application_name', 'from-preamble', false)")
	}}
	require.NoError(t, pooltx.WithTx(ctx, pool, opts, func(context.Context, pgx.Tx) error { return nil }))
	name, _ := pgtest.AppName(ctx, t, pool)
	assert.Equal(t, fresh, name, "the preamble's session-level set_config is reset")

	pgtest.LeaveAppName(ctx, t, pool, "left-by-another")
	opts = &pooltx.TxOptions{PreambleChangesNoState: true, Preamble: func(b *pgx.Batch) {
		b.Queue("SELECT pg_advisory_xact_lock(7)")
	}}
	require.NoError(t, pooltx.WithTx(ctx, pool, opts, func(context.Context, pgx.Tx) error { return nil }))
	name, _ = pgtest.AppName(ctx, t, pool)
	assert.Equal(t, "left-by-another", name, "a vouched-for preamble and a quiet fn: COMMIT alone")
}

// A lend is not forgotten: once code lent the connection has sent
// anything, a later quiet step (Tx with a quiet fn, another Lend, Reclaim)
// does not let the connection go back without the reset.
func TestEarlierLendIsNotForgotten(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, _ := pgtest.AppName(ctx, t, pool)
	dirty := func(ctx context.Context, c *pgx.Conn) {
		t.Helper()
		_, err := c.Exec(ctx, "SELECT set_config('application_name', 'left-by-lent-code', false), pg_advisory_lock(4242)")
		require.NoError(t, err)
	}
	check := func(what string) {
		t.Helper()
		name, _ := pgtest.AppName(ctx, t, pool)
		assert.Equal(t, fresh, name, what)
		pgtest.AssertNoAdvisoryLocks(t, pool)
	}

	c, err := pooltx.Acquire(ctx, pool, nil)
	require.NoError(t, err)
	dirty(ctx, c.Lend(ctx))
	require.NoError(t, c.Tx(ctx, nil, func(context.Context, pgx.Tx) error { return nil }))
	assert.True(t, c.Lent(), "a quiet Tx after lent code that sent something")
	assert.False(t, c.Release(), "reset, kept")
	check("Lend, work, then a quiet Tx")

	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		dirty(ctx, c.Conn())
		c.Lend(ctx)
		return nil
	}))
	check("work, then Lend again")

	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		dirty(ctx, c.Conn())
		assert.False(t, c.Reclaim())
		c.Lend(ctx)
		assert.False(t, c.Reclaim(), "found sent once: stays lent")
		return nil
	}))
	check("work, Reclaim, Lend, Reclaim")

	// Lent code that calls Reclaim itself, before its work, does not lose
	// the drop of what its LISTEN queued.
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		assert.True(t, c.Reclaim())
		_, err := c.Conn().Exec(ctx, "LISTEN pgxlock_quiet; NOTIFY pgxlock_quiet, 'for the lent code only'")
		return err
	}))
	noNotification(ctx, t, pool)

	// What the work LISTENed for and got notified of is dropped with the
	// reset, a quiet Tx after it notwithstanding.
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		if _, err := c.Conn().Exec(ctx, "LISTEN pgxlock_quiet; NOTIFY pgxlock_quiet, 'for the lent code only'"); err != nil {
			return err
		}
		return c.Tx(ctx, nil, func(context.Context, pgx.Tx) error { return nil })
	}))
	noNotification(ctx, t, pool)
}

// noNotification asserts that the next borrower of pool gets no
// notification within 200 ms.
func noNotification(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	next, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer next.Release()
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	n, err := next.Conn().WaitForNotification(wctx)
	assert.Nil(t, n, "another borrower's notification")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// Tx's COMMIT or ROLLBACK without the reset vouches for nothing its caller
// ran on the connection before Tx: those statements are undone at release
// as they would be without the Tx.
func TestQuietTxDoesNotVouchForWhatRanBefore(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	fresh, _ := pgtest.AppName(ctx, t, pool)
	errWork := errors.New("work failed")
	for name, tx := range map[string]func(c *pooltx.Conn) error{
		"commit": func(c *pooltx.Conn) error {
			return c.Tx(ctx, nil, func(context.Context, pgx.Tx) error { return nil })
		},
		"rollback": func(c *pooltx.Conn) error {
			err := c.Tx(ctx, nil, func(context.Context, pgx.Tx) error { return errWork })
			if errors.Is(err, errWork) {
				return nil
			}
			return err
		},
		"vouched preamble refused": func(c *pooltx.Conn) error {
			opts := &pooltx.TxOptions{PreambleChangesNoState: true, Preamble: func(b *pgx.Batch) {
				b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { return errWork })
			}}
			err := c.Tx(ctx, opts, func(context.Context, pgx.Tx) error { return nil })
			if errors.Is(err, errWork) {
				return nil
			}
			return err
		},
	} {
		c, err := pooltx.Acquire(ctx, pool, nil)
		require.NoError(t, err)
		_, err = c.Conn().Exec(ctx, "SELECT set_config('application_name', 'run-before-tx', false), pg_advisory_lock(4343)")
		require.NoError(t, err)
		require.NoError(t, tx(c), name)
		assert.False(t, c.Release(), name)
		got, _ := pgtest.AppName(ctx, t, pool)
		assert.Equal(t, fresh, got, name)
		pgtest.AssertNoAdvisoryLocks(t, pool)
	}
}

// Quiet work that broke the connection without sending a statement (shut
// its write side, set a deadline on its socket) or during which the server
// ended the session does not hand the next borrower a dead connection:
// the shutdown and the server's farewell are seen in the socket's state and
// received bytes (the reset then runs and fails, and the connection is
// destroyed; a read side shut down destroys it without the reset: after
// shutdown(SHUT_RD) Linux still delivers an answer that arrives before the
// read asks, so the reset could seem to succeed, and the next borrower got
// EOF, 3 runs in 40 before), and a deadline is cleared.
func TestQuietWorkOnABrokenConnection(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	cases := map[string]func(ctx context.Context, c *pooltx.Conn){
		"write side shut down": func(_ context.Context, c *pooltx.Conn) {
			require.NoError(t, tcpOf(t, c).CloseWrite())
		},
		"read side shut down": func(_ context.Context, c *pooltx.Conn) {
			require.NoError(t, tcpOf(t, c).CloseRead()) // no byte sent, the TCP state stays ESTABLISHED
		},
		"deadline in the past": func(_ context.Context, c *pooltx.Conn) {
			require.NoError(t, c.Conn().PgConn().Conn().SetDeadline(time.Now().Add(-time.Second)))
		},
		"session ended by the server": func(ctx context.Context, c *pooltx.Conn) {
			pid := c.Conn().PgConn().PID()
			_, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int64(pid))
			require.NoError(t, err)
			for { // the backend has exited once it is gone from pg_stat_activity
				var n int
				require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n))
				if n == 0 {
					return
				}
				require.NoError(t, ctx.Err())
			}
		},
	}
	for name, work := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			pool := pgtest.NewPool(t, cfg)
			_, _ = pgtest.AppName(ctx, t, pool)
			require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
				work(ctx, c)
				return nil
			}))
			var one int
			require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one), "the next borrower's connection works")
		})
	}
}

// tcpOf returns the TCP socket under c (under TLS, if any).
func tcpOf(t *testing.T, c *pooltx.Conn) *net.TCPConn {
	t.Helper()
	nc := c.Conn().PgConn().Conn()
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = u.NetConn()
	}
	tc, ok := nc.(*net.TCPConn)
	require.True(t, ok, "%T", nc)
	return tc
}
