package advisory_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// silentPool returns a pool whose server accepts TCP connections and never
// answers: a frozen server, a black-holed proxy. pgx's own connect_timeout
// ends the dials the pool goes on with in the background.
func silentPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or written
			mu.Unlock()
		}
	})
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable&connect_timeout=2", ln.Addr()))
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return pool
}

// Regression (issue 10 item 6): classify took any deadline for a lock
// timeout, so a server that accepts TCP and never answers made WithLock,
// and even the Try calls, report ErrLockTimeout ("pgxlock run" said "timed
// out waiting" instead of "cannot connect"); and a Try call waited for a
// connection until its context ended. Now a connection that cannot be had
// in time is ErrNoConnection, and a Try call waits for one at most
// Config.LockTimeout, else DefaultTryConnWait.
func TestNoConnectionIsNotALockTimeout(t *testing.T) {
	// Each case runs under a context far longer than DefaultTryConnWait:
	// a Try call that waited for it would fail with its deadline.
	tenSeconds := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	noop := func(context.Context, *pgx.Conn) error { return nil }
	xnoop := func(context.Context, pgx.Tx) error { return nil }
	k := key(t)
	check := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, advisory.ErrNoConnection)
		assert.NotErrorIs(t, err, advisory.ErrLockTimeout)
		assert.NotErrorIs(t, err, advisory.ErrNotAcquired)
		assert.Equal(t, advisory.OutcomeNoConnection, advisory.OutcomeOf(err))
	}

	t.Run("silent server", func(t *testing.T) {
		ctx := tenSeconds(t)
		l := newLocker(t, silentPool(t), advisory.Config{})
		check(t, l.WithLock(ctx, k, &advisory.Options{Timeout: 300 * time.Millisecond}, noop))
		check(t, l.TryWithLock(ctx, k, nil, noop))
		check(t, l.TryWithXactLock(ctx, k, nil, xnoop))
	})

	t.Run("pool exhausted", func(t *testing.T) {
		ctx := tenSeconds(t)
		cfg := pgtest.Config(t)
		cfg.MaxConns = 1
		pool := pgtest.NewPool(t, cfg)
		l := newLocker(t, pool, advisory.Config{})
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		check(t, l.TryWithLock(ctx, k, nil, noop))
		check(t, l.TryWithXactLock(ctx, k, nil, xnoop))
		_, err = l.TryLock(ctx, k, nil)
		check(t, err)
	})

	t.Run("Config.MaxConns reached", func(t *testing.T) {
		ctx := tenSeconds(t)
		pool := pgtest.Pool(t)
		l := newLocker(t, pool, advisory.Config{MaxConns: 1, LockTimeout: 200 * time.Millisecond})
		h, err := l.Lock(ctx, key(t), nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, h.Unlock(ctx)) }()
		check(t, l.TryWithLock(ctx, k, nil, noop))
		check(t, l.WithLock(ctx, k, nil, noop)) // waited for a connection, not a lock
	})
}
