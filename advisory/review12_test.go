package advisory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/pooltx"
)

func delayProxyTarget(t *testing.T) string {
	c := pgtest.Config(t).ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

func proxiedPoolConfig(t *testing.T, addr string) *pgxpool.Config {
	cfg := pgtest.Config(t)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	pn, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(pn), nil
	cfg.MaxConns = 1
	return cfg
}

// A bounded transaction-scope call on a connection never lent before, the
// network frozen: the first Lend's identity read (Conn.Tx lends before BEGIN)
// runs under CleanupTimeout, not under Options.Timeout or ctx.
func TestBoundedXactCallsOnFrozenFirstLend(t *testing.T) {
	for _, name := range []string{"WithXactLock", "TryWithXactLock", "WithLock", "TryWithLock"} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			px, err := tcpproxy.New("tcp", delayProxyTarget(t))
			require.NoError(t, err)
			defer px.Close()
			pool := pgtest.NewPool(t, proxiedPoolConfig(t, "127.0.0.1:"+strconv.Itoa(px.Port())))
			l := newLocker(t, pool, advisory.Config{CleanupTimeout: 3 * time.Second})
			// Warm the Locker (its once-per-Locker check), then a fresh connection.
			require.NoError(t, l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil }))
			pool.Reset()
			require.NoError(t, pool.Ping(ctx)) // a new connection, never pinned by pooltx
			px.Cut()
			defer px.CloseCut()
			opts := &advisory.Options{Timeout: 300 * time.Millisecond}
			cctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
			defer cancel()
			fn := func(context.Context, pgx.Tx) error { return nil }
			sfn := func(context.Context, *pgx.Conn) error { return nil }
			k := key(t)
			start := time.Now()
			switch name {
			case "WithXactLock":
				err = l.WithXactLock(cctx, k, opts, fn)
			case "TryWithXactLock":
				err = l.TryWithXactLock(cctx, k, nil, fn)
			case "WithLock":
				err = l.WithLock(cctx, k, opts, sfn)
			case "TryWithLock":
				err = l.TryWithLock(cctx, k, nil, sfn)
			}
			el := time.Since(start)
			t.Logf("%s: err=%v after %v", name, err, el)
			require.Error(t, err)
			require.Less(t, el, 1500*time.Millisecond, "%s with Options.Timeout 300ms and a 400 ms ctx on a frozen network", name)
		})
	}
}

// Session callback under the lock, first Lend's identity read answered late
// (after CleanupTimeout): the Locker still calls fn, on a connection out of
// step with its answers.
func TestWithLockLateIdentityAnswerNeverReachesTheCallback(t *testing.T) {
	ctx := testCtx(t)
	px, err := tcpproxy.New("tcp", delayProxyTarget(t))
	require.NoError(t, err)
	defer px.Close()
	cfg := proxiedPoolConfig(t, "127.0.0.1:"+strconv.Itoa(px.Port()))
	cfg.ConnConfig.TLSConfig = nil // the proxy reads the statements' text
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{CleanupTimeout: 200 * time.Millisecond})
	// Warm the Locker on a connection, then drop it.
	require.NoError(t, l.WithLock(ctx, key(t), nil, func(context.Context, *pgx.Conn) error { return nil }))
	pool.Reset()
	px.Delay([]byte("session_user::pg_catalog.text"), 600*time.Millisecond)
	var a, b string
	err = l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT 'mine-a'::text, 'mine-b'::text").Scan(&a, &b)
	})
	px.Delay(nil, 0)
	t.Logf("WithLock err=%v delayed=%d", err, px.Delayed())
	require.Equal(t, int64(1), px.Delayed())
	// Now: the first Lend's failure closes the connection (ending the
	// session and its lock), the callback does not run, and the call
	// fails with ErrNoConnection.
	require.ErrorIs(t, err, advisory.ErrNoConnection)
	assert.Equal(t, []string{"", ""}, []string{a, b}, "the callback did not run")
}

// Review round 12 matrix: AfterConnect sets a role whose name needs quoting; every
// helper in several outcomes; every exec mode; TLS and plain. The next
// borrower must see what a fresh connection of the pool sees.
func TestResetMatrixAfterConnectQuotedRole(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	role := fmt.Sprintf(`R12 "q" %d`, pgtest.UniqueInt32(t)&0x7fffff)
	other := fmt.Sprintf(`r12o %d`, pgtest.UniqueInt32(t)&0x7fffff)
	for _, r := range []string{role, other} {
		_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize())
		require.NoError(t, err)
		r := r
		t.Cleanup(func() {
			_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{r}.Sanitize())
			_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
		})
	}
	seq := fmt.Sprintf("r12seq_%d", pgtest.UniqueInt32(t)&0x7fffffff)
	_, err := admin.Exec(ctx, "CREATE SEQUENCE "+seq+"; GRANT ALL ON SEQUENCE "+seq+" TO PUBLIC")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+seq) })

	dirty := func(ctx context.Context, c *pgx.Conn) error {
		for _, s := range []string{
			"SELECT nextval('" + seq + "')",
			"SELECT pg_advisory_lock(4242)",
			"CREATE TEMP TABLE r12t(x int)",
			"LISTEN r12chan",
			"BEGIN", "DECLARE r12cur CURSOR WITH HOLD FOR SELECT 1", "COMMIT",
			"SET work_mem = '7MB'",
			"SET search_path = pg_temp, public",
			"SELECT set_config('statement_timeout', '77s', false)",
			"SET SESSION AUTHORIZATION " + pgx.Identifier{other}.Sanitize(),
		} {
			if _, err := c.Exec(ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	txDirty := func(ctx context.Context, tx pgx.Tx) error {
		for _, s := range []string{
			"SELECT nextval('" + seq + "')",
			"SELECT pg_advisory_lock(4242)",
			"CREATE TEMP TABLE r12t(x int)",
			"LISTEN r12chan",
			"DECLARE r12cur CURSOR WITH HOLD FOR SELECT 1",
			"SET work_mem = '7MB'",
			"SELECT set_config('role', " + quoteLit(other) + ", false)",
		} {
			if _, err := tx.Exec(ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	errBoom := errors.New("boom")
	state := func(ctx context.Context, t *testing.T, pool *pgxpool.Pool) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT concat_ws(' | ',
			'cu='||current_user, 'su='||session_user, 'role='||current_setting('role'),
			'locks='||(SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND pid=pg_backend_pid()),
			'temp='||(SELECT count(*) FROM pg_class WHERE relnamespace=pg_my_temp_schema()),
			'listen='||(SELECT count(*) FROM pg_listening_channels()),
			'cursors='||(SELECT count(*) FROM pg_cursors),
			'work_mem='||current_setting('work_mem'), 'sp='||current_setting('search_path'),
			'st='||current_setting('statement_timeout'))`, pgx.QueryExecModeSimpleProtocol).Scan(&s))
		// currval/lastval undefined
		_, err := pool.Exec(ctx, "SELECT lastval()", pgx.QueryExecModeSimpleProtocol)
		if err == nil {
			s += " | lastval DEFINED"
		}
		return s
	}
	modes := map[string]pgx.QueryExecMode{
		"cache": pgx.QueryExecModeCacheStatement, "describe": pgx.QueryExecModeCacheDescribe,
		"describeexec": pgx.QueryExecModeDescribeExec, "exec": pgx.QueryExecModeExec, "simple": pgx.QueryExecModeSimpleProtocol,
	}
	tlsModes := []bool{false}
	if pgtest.Config(t).ConnConfig.TLSConfig != nil { // the DSN path; the throwaway cluster has no TLS
		tlsModes = append(tlsModes, true)
	}
	for _, tls := range tlsModes {
		for mname, mode := range modes {
			t.Run(fmt.Sprintf("tls=%v/%s", tls, mname), func(t *testing.T) {
				cfg := pgtest.Config(t)
				if !tls {
					cfg.ConnConfig.TLSConfig = nil
				}
				cfg.ConnConfig.Fallbacks = nil
				cfg.MaxConns = 1
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
					_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize(), pgx.QueryExecModeSimpleProtocol)
					return err
				}
				pool := pgtest.NewPool(t, cfg)
				want := state(ctx, t, pool)
				require.Contains(t, want, "cu="+role)
				l := newLocker(t, pool, advisory.Config{})
				steps := []struct {
					name string
					run  func() error
				}{
					{"WithLock nil", func() error { return l.WithLock(ctx, key(t), nil, dirty) }},
					{"WithLock err", func() error {
						return l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error { _ = dirty(ctx, c); return errBoom })
					}},
					{"TryWithLock nil", func() error { return l.TryWithLock(ctx, key(t), nil, dirty) }},
					{"WithLock cancelled ctx", func() error {
						cctx, cancel := context.WithCancel(ctx)
						return l.WithLock(cctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error { err := dirty(ctx, c); cancel(); return err })
					}},
					{"WithXactLock nil", func() error { return l.WithXactLock(ctx, key(t), nil, txDirty) }},
					{"WithXactLock err", func() error {
						return l.WithXactLock(ctx, key(t), nil, func(ctx context.Context, tx pgx.Tx) error { _ = txDirty(ctx, tx); return errBoom })
					}},
					{"pooltx.WithConn", func() error {
						return pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error { return dirty(ctx, c.Conn()) })
					}},
					{"pooltx.WithTx", func() error { return pooltx.WithTx(ctx, pool, nil, txDirty) }},
					{"pooltx.WithConn DeferIdentity", func() error {
						return pooltx.WithConn(ctx, pool, &pooltx.ConnOptions{DeferIdentity: true}, func(ctx context.Context, c *pooltx.Conn) error { return dirty(ctx, c.Conn()) })
					}},
				}
				for i, st := range steps {
					if i%3 == 0 {
						pool.Reset() // next step on a fresh connection (first pin / first lend)
					}
					err := st.run()
					if err != nil && !errors.Is(err, errBoom) && !errors.Is(err, context.Canceled) {
						t.Logf("%s: %v", st.name, err)
					}
					assert.Equal(t, want, state(ctx, t, pool), "next borrower after %s", st.name)
				}
			})
		}
	}
}

func quoteLit(s string) string {
	var b bytes.Buffer
	b.WriteByte('\'')
	for _, r := range s {
		if r == '\'' {
			b.WriteByte('\'')
		}
		b.WriteRune(r)
	}
	b.WriteByte('\'')
	return b.String()
}
