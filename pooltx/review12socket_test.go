package pooltx_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/pooltx"
)

func rawTCP(nc net.Conn) *net.TCPConn {
	for {
		switch c := nc.(type) {
		case *net.TCPConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
}

// Review round 12, over TLS and plain, several socket attacks, each repeated: the
// next borrower's statement must succeed.
func TestSocketAttacksNeverReachNextBorrower(t *testing.T) {
	errBoom := errors.New("boom")
	attacks := map[string]func(ctx context.Context, c *pooltx.Conn) error{
		"stmt then CloseRead, nil": func(ctx context.Context, c *pooltx.Conn) error {
			if _, err := c.Conn().Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			return rawTCP(c.Conn().PgConn().Conn()).CloseRead()
		},
		"stmt then CloseRead, error": func(ctx context.Context, c *pooltx.Conn) error {
			_, _ = c.Conn().Exec(ctx, "SELECT 1")
			_ = rawTCP(c.Conn().PgConn().Conn()).CloseRead()
			return errBoom
		},
		"CloseRead only": func(ctx context.Context, c *pooltx.Conn) error {
			return rawTCP(c.Conn().PgConn().Conn()).CloseRead()
		},
		"CloseWrite, error": func(ctx context.Context, c *pooltx.Conn) error {
			_ = rawTCP(c.Conn().PgConn().Conn()).CloseWrite()
			return errBoom
		},
	}
	for _, tls := range tlsModes(t) {
		for name, fn := range attacks {
			t.Run(strconv.FormatBool(tls)+"/"+name, func(t *testing.T) {
				ctx := testCtx(t)
				cfg := configWithTLS(t, tls)
				cfg.MaxConns = 1
				pool := pgtest.NewPool(t, cfg)
				bad, n := 0, 60
				var first error
				for i := 0; i < n; i++ {
					_ = pooltx.WithConn(ctx, pool, nil, fn)
					if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
						bad++
						if first == nil {
							first = err
						}
					}
				}
				require.Zero(t, bad, "next borrower failed %d of %d; first: %v", bad, n, first)
			})
		}
	}
}

// A server FIN with nothing before it while a quiet callback runs (proxy
// closes the link): never handed on.
func TestFinDuringQuietCallback(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.Config(t).ConnConfig
	px, err := tcpproxy.New("tcp", net.JoinHostPort(base.Host, strconv.Itoa(int(base.Port))))
	require.NoError(t, err)
	defer px.Close()
	cfg := proxiedConfig(t, "127.0.0.1:"+strconv.Itoa(px.Port()))
	pool := pgtest.NewPool(t, cfg)
	bad := 0
	var first error
	for i := 0; i < 20; i++ {
		_ = pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			px.Cut()
			px.CloseCut()
			return nil
		})
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			bad++
			if first == nil {
				first = err
			}
		}
	}
	require.Zero(t, bad, "next borrower failed %d of 20; first: %v", bad, first)
}

// tlsModes is plain TCP, and TLS too where the harness's server speaks it
// (the DSN path; the throwaway cluster does not).
func tlsModes(t *testing.T) []bool {
	if pgtest.Config(t).ConnConfig.TLSConfig != nil {
		return []bool{false, true}
	}
	return []bool{false}
}

// configWithTLS is the harness's config over TLS or plain TCP, without
// fallbacks to the other.
func configWithTLS(t *testing.T, tls bool) *pgxpool.Config {
	cfg := pgtest.Config(t)
	if !tls {
		cfg.ConnConfig.TLSConfig = nil
	}
	cfg.ConnConfig.Fallbacks = nil
	return cfg
}
