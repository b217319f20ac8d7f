package lease_test

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// "Granted, but the answer was lost": the server runs and commits the
// acquiring statement, and the connection breaks before the client reads the
// result. The client cannot tell; it must give back whatever the statement
// may have taken. A proxy between the pool and the server swallows the one
// response and drops the connection; the lease the statement took must be
// gone afterwards, and the next acquisition must work.
func TestUnknownOutcomeIsGivenBack(t *testing.T) {
	for _, form := range []string{"column", "manager"} {
		t.Run(form, func(t *testing.T) {
			p1, _, schema := twoPools(t)
			ctx := testCtx(t)
			proxy := newCutProxy(t, p1.Config().ConnConfig.Host, p1.Config().ConnConfig.Port)
			cfg := pgtest.Config(t)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = proxy.host, proxy.port
			cfg.ConnConfig.Fallbacks = nil
			cfg.MaxConns = 1
			via := pgtest.NewPool(t, cfg)

			var tryAcquire func() error
			var held func() bool
			var tokens func() int64
			switch form {
			case "column":
				usersTable(t, p1, schema, time.Minute, 1)
				users := pgx.Identifier{schema, "users"}.Sanitize()
				c, err := lease.NewColumn(via, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
					OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: time.Minute})
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
			// so that the cut below hits the execution, not the preparation.
			require.NoError(t, tryAcquire())
			before := tokens()

			proxy.cutNextResponse.Store(true)
			err := tryAcquire()
			require.Error(t, err)
			require.NotErrorIs(t, err, lease.ErrNotAcquired)
			t.Logf("the client saw: %v", err)
			assert.False(t, proxy.cutNextResponse.Load(), "the proxy cut a response")
			assert.Equal(t, before+1, tokens(), "the server did run the acquisition")
			assert.False(t, held(), "and the give-back removed the lease it took")
			require.NoError(t, tryAcquire(), "the resource is free again")
		})
	}
}

// cutProxy forwards TCP connections to PostgreSQL. When cutNextResponse is
// set, the next data the server sends on any connection is discarded and that
// client connection is closed, as a network failure after the request left
// the client would.
type cutProxy struct {
	host            string
	port            uint16
	cutNextResponse atomic.Bool
}

func newCutProxy(t *testing.T, host string, port uint16) *cutProxy {
	p := &cutProxy{host: "127.0.0.1"}
	p.port = uint16(forwardProxy(t, host, port, func(client, server net.Conn) { // server -> client, unless cut
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && p.cutNextResponse.CompareAndSwap(true, false) {
				client.Close()
				server.Close()
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					server.Close()
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	}))
	return p
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
