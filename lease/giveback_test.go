package lease_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/lease"
)

// "Granted, but the answer was lost": the server runs and commits the
// acquiring statement, and the connection breaks before the client reads the
// result. The client cannot tell; it must give back whatever the statement
// may have taken. A proxy between the pool and the server swallows the one
// response and drops the connection; the lease the statement took must be
// gone afterwards, and the next acquisition must work. In the exec modes
// that keep a statement prepared (describe_exec describes at every call, and
// the answer lost would be the description's): in the Exec and simple
// protocol modes pgx reports the failed read as "conn closed", which it calls
// safe to retry, and no give-back ran.
func TestUnknownOutcomeIsGivenBack(t *testing.T) {
	for _, form := range []string{"column", "manager"} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
			pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(form+"/"+mode.String(), func(t *testing.T) { unknownOutcomeIsGivenBack(t, form, mode) })
		}
	}
}

// proxiedPool is a pool of one connection in mode to p1's server through a tcpproxy,
// both closed at the test's end.
func proxiedPool(t *testing.T, p1 *pgxpool.Pool, mode pgx.QueryExecMode) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	cc := p1.Config().ConnConfig
	proxy, err := tcpproxy.New("tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(proxy.Port())
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 1
	return pgtest.NewPool(t, cfg), proxy
}

func unknownOutcomeIsGivenBack(t *testing.T, form string, mode pgx.QueryExecMode) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	via, proxy := proxiedPool(t, p1, mode)

	var tryAcquire func() error
	var held func() bool
	var tokens func() int64
	switch form {
	case "column":
		usersTable(t, p1, schema, time.Minute, 1)
		users := pgx.Identifier{schema, "users"}.Sanitize()
		c, err := lease.NewColumn(via, usersConfig(schema, time.Minute))
		require.NoError(t, err)
		tryAcquire = func() error {
			l, err := c.TryAcquire(ctx, int64(1))
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}
		held = func() bool {
			return queryOne[bool](t, p1, "SELECT identity_action_locked_by IS NOT NULL FROM "+users+" WHERE id = 1")
		}
		tokens = func() int64 {
			return queryOne[int64](t, p1, "SELECT identity_action_fence FROM "+users+" WHERE id = 1")
		}
	case "manager":
		newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
		m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
		require.NoError(t, err)
		tryAcquire = func() error {
			l, err := m.TryAcquire(ctx, "r", nil)
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}
		held = func() bool {
			hs, err := m.List(ctx, &lease.ListOptions{IncludeExpired: true})
			require.NoError(t, err)
			return len(hs) > 0
		}
		resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
		tokens = func() int64 { return queryOne[int64](t, p1, "SELECT fence FROM "+resources+" WHERE resource = 'r'") }
	}

	// Warm up: the statements get prepared on the proxied connection,
	// so that the cut below hits the execution, not the preparation
	// (twice: a Column's first acquisition runs the form that checks the
	// locked-at column's type, the later ones another statement).
	require.NoError(t, tryAcquire())
	require.NoError(t, tryAcquire())
	before := tokens()

	proxy.DropNextAnswer()
	err := tryAcquire()
	require.Error(t, err)
	require.NotErrorIs(t, err, lease.ErrNotAcquired)
	t.Logf("the client saw: %v", err)
	assert.True(t, proxy.AnswerDropped(), "the proxy cut a response")
	assert.Equal(t, before+1, tokens(), "the server did run the acquisition")
	assert.False(t, held(), "and the give-back removed the lease it took")
	require.NoError(t, tryAcquire(), "the resource is free again")
}

// forwardProxy listens on a free loopback port and forwards every TCP
// connection to host:port: what the client sends is copied to the server,
// and back runs on a goroutine of its own per connection with what the
// server sends. Everything is closed, and every goroutine awaited, at the
// test's cleanup. It returns the port.
func forwardProxy(t *testing.T, host string, port uint16, back func(client, server net.Conn)) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	target := net.JoinHostPort(host, strconv.Itoa(int(port)))
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			open = append(open, client, server)
			mu.Unlock()
			wg.Go(func() { // client -> server
				_, _ = io.Copy(server, client)
				server.Close()
			})
			wg.Go(func() { back(client, server) })
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// Do's release is sent, the server commits it, and the connection fails before the
// answer arrives: Do retries the release on a fresh connection, finds the lease gone,
// and, since the first attempt's outcome was unknown, reports the work's success (nil).
// In the Exec and simple protocol modes pgx called the failed read safe to retry, so the
// retry's ErrLeaseLost was returned as the release's failure.
func TestDoReleaseWhoseAnswerIsLostSucceeds(t *testing.T) {
	for _, form := range []string{"column", "manager"} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec,
			pgx.QueryExecModeSimpleProtocol} {
			t.Run(form+"/"+mode.String(), func(t *testing.T) {
				p1, _, schema := twoPools(t)
				ctx := testCtx(t)
				via, proxy := proxiedPool(t, p1, mode)
				switch form {
				case "column":
					usersTable(t, p1, schema, time.Minute, 1)
					c, err := lease.NewColumn(via, usersConfig(schema, time.Minute))
					require.NoError(t, err)
					err = c.TryDo(ctx, int64(1), nil, func(context.Context, *lease.ColumnLease) error { proxy.DropNextAnswer(); return nil })
					require.True(t, proxy.AnswerDropped(), "the proxy cut a response")
					require.NoError(t, err, "the work succeeded and the lease was released")
					l, err := c.TryAcquire(ctx, int64(1))
					require.NoError(t, err, "the row is free")
					require.NoError(t, l.Release(ctx))
				case "manager":
					newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
					m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
					require.NoError(t, err)
					err = m.TryDo(ctx, "r", nil, func(context.Context, *lease.Lease) error { proxy.DropNextAnswer(); return nil })
					require.True(t, proxy.AnswerDropped(), "the proxy cut a response")
					require.NoError(t, err, "the work succeeded and the lease was released")
					hs, err := m.List(ctx, &lease.ListOptions{IncludeExpired: true})
					require.NoError(t, err)
					assert.Empty(t, hs)
				}
			})
		}
	}
}
