package pooltx_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/pooltx"
)

// opaqueConn hides the *net.TCPConn (no NetConn method): the meter cannot
// read the socket's counts ("the reset always runs").
type opaqueConn struct{ net.Conn }

func opaquePool(t *testing.T) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	d := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return opaqueConn{c}, nil
	}
	return pgtest.NewPool(t, cfg)
}

// Review round 12: "a deadline left on the socket never reaches the next borrower".
// On a connection whose counts cannot be read (custom DialFunc), Reclaim
// returns before clearing the deadline.
func TestDeadlineLeftOnUnmeasuredConnNeverReachesNextBorrower(t *testing.T) {
	ctx := testCtx(t)
	pool := opaquePool(t)
	require.NoError(t, pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
		if _, err := c.Conn().Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		return c.Conn().PgConn().Conn().SetDeadline(time.Now().Add(700 * time.Millisecond))
	}))
	_, err := pool.Exec(ctx, "SELECT pg_sleep(1.2)")
	require.NoError(t, err, "next borrower's statement (a deadline the earlier callback set reached it)")
}

// Same, on plain TCP: a callback lent a second time on one pin (Lend,
// Reclaim finds it not quiet, then Conn.Tx) sets a deadline; the second
// Reclaim returns early (!marked) and does not clear it.
func TestDeadlineLeftAfterSecondLendNeverReachesNextBorrower(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	c, err := pooltx.Acquire(ctx, pool, nil)
	require.NoError(t, err)
	_, err = c.Lend(ctx).Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	require.False(t, c.Reclaim())
	require.NoError(t, c.Tx(ctx, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		return tx.Conn().PgConn().Conn().SetDeadline(time.Now().Add(700 * time.Millisecond))
	}))
	require.False(t, c.Release(), "kept")
	_, err = pool.Exec(ctx, "SELECT pg_sleep(1.2)")
	require.NoError(t, err, "next borrower's statement (a deadline the earlier callback set reached it)")
}

// Review round 12: a read side shut down never reaches the next borrower. Here
// the callback sent a statement first, so Reclaim's counts differ and it
// returns before its peek; the reset may then read its answer.
func TestCloseReadAfterStatementNeverReachesNextBorrower(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	bad := 0
	var firstErr error
	const n = 80
	for i := 0; i < n; i++ {
		var attacked *pgx.Conn
		_ = pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			attacked = c.Conn()
			if _, err := c.Conn().Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			return tcpOf(t, c).CloseRead()
		})
		pc, err := pool.Acquire(ctx)
		require.NoError(t, err)
		same := pc.Conn() == attacked
		_, err = pc.Exec(ctx, "SELECT 1")
		pc.Release()
		if err != nil {
			bad++
			if firstErr == nil {
				firstErr = fmt.Errorf("same connection as the attacked one: %v: %w", same, err)
			}
		}
	}
	require.Zero(t, bad, "next borrower failed %d of %d times; first: %v", bad, n, firstErr)
}

func proxiedConfig(t *testing.T, addr string) *pgxpool.Config {
	cfg := pgtest.Config(t)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	cfg.ConnConfig.Host = host
	var pn uint16
	for _, ch := range port {
		pn = pn*10 + uint16(ch-'0')
	}
	cfg.ConnConfig.Port = pn
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 1
	return cfg
}

// Review round 12: when the first pin's identity read is cut by the
// cleanup bound but its answer is only late, pgx does not close the
// connection (a timeout is not fatal to pgconn), and WithConn lent it
// anyway: the callback read the identity read's answer as its own
// statement's. Acquire now destroys that connection and fails.
func TestLateIdentityAnswerNeverReachesTheCallback(t *testing.T) {
	ctx := testCtx(t)
	px, err := tcpproxy.New("tcp", net.JoinHostPort(pgtest.Config(t).ConnConfig.Host, itoa(pgtest.Config(t).ConnConfig.Port)))
	require.NoError(t, err)
	defer px.Close()
	cfg := proxiedConfig(t, "127.0.0.1:"+itoa(uint16(px.Port())))
	cfg.ConnConfig.TLSConfig = nil // the proxy reads the statements' text
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool := pgtest.NewPool(t, cfg)
	px.Delay([]byte("session_user::pg_catalog.text"), 600*time.Millisecond)
	var a, b string
	start := time.Now()
	err = pooltx.WithConn(ctx, pool, &pooltx.ConnOptions{CleanupTimeout: 200 * time.Millisecond}, func(ctx context.Context, c *pooltx.Conn) error {
		t.Logf("callback runs after %v; Dirty()=%v", time.Since(start), c.Dirty())
		return c.Conn().QueryRow(ctx, "SELECT 'mine-a'::text, 'mine-b'::text").Scan(&a, &b)
	})
	px.Delay(nil, 0)
	t.Logf("WithConn err=%v delayed=%d", err, px.Delayed())
	require.Equal(t, int64(1), px.Delayed())
	// Now: Acquire destroys the connection whose identity read was cut and
	// returns the error; the callback never runs on it.
	require.Error(t, err)
	require.ErrorContains(t, err, "acquire connection")
	require.Equal(t, []string{"", ""}, []string{a, b}, "the callback did not run")
}

func itoa(p uint16) string {
	if p == 0 {
		return "0"
	}
	var b []byte
	for p > 0 {
		b = append([]byte{byte('0' + p%10)}, b...)
		p /= 10
	}
	return string(b)
}

// ctx vs the first pin's identity read on a frozen network (documented:
// bounded by the cleanup timeout, not ctx). Measures how long WithTx with a
// 300 ms ctx takes.
func TestWithTxCtxDuringFrozenFirstPin(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.Config(t)
	px, err := tcpproxy.New("tcp", net.JoinHostPort(base.ConnConfig.Host, itoa(base.ConnConfig.Port)))
	require.NoError(t, err)
	defer px.Close()
	cfg := proxiedConfig(t, "127.0.0.1:"+itoa(uint16(px.Port())))
	pool := pgtest.NewPool(t, cfg) // pings: a connection without a baseline is idle in the pool
	px.Cut()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = pooltx.WithTx(cctx, pool, &pooltx.TxOptions{CleanupTimeout: 2 * time.Second}, func(ctx context.Context, tx pgx.Tx) error { return nil })
	el := time.Since(start)
	t.Logf("WithTx err=%v after %v", err, el)
	px.CloseCut()
	require.Less(t, el, time.Second, "WithTx with a 300 ms ctx")
	_ = errors.New
}
