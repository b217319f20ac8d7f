package lease_test

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/lease"
)

// acquireLater runs m.Acquire of resource, then its Release, in a
// goroutine of its own; the channel gets the error.
func acquireLater(ctx context.Context, m *lease.Manager, resource string) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := m.Acquire(ctx, resource, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

// requireAcquired waits for acquireLater's result, which must be nil
// (woken, acquired, released); the minute is a guard, not a budget.
func requireAcquired(t *testing.T, got <-chan error, woken, never string) {
	t.Helper()
	select {
	case err := <-got:
		require.NoError(t, err, woken)
	case <-time.After(time.Minute):
		t.Fatal(never)
	}
}

// waitForListener waits (bounded) until a backend of pool's application is
// in LISTEN: a waiter has subscribed.
func waitForListener(t *testing.T, pool *pgxpool.Pool, observer *pgxpool.Pool) {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	require.Eventually(t, func() bool {
		return queryOne[int](t, observer, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app) > 0
	}, 20*time.Second, 5*time.Millisecond, "no waiter started listening")
}

// Issue 11 item 3: with a pool of one connection, the shared LISTEN
// connection took it, so the holder's Release (same pool) and the waiter's
// own attempts both blocked. The listener must never starve the calls it
// serves, whatever the pool size.
func TestPoolOfOneListenerDoesNotStarveCalls(t *testing.T) {
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	observer := pgtest.Pool(t)
	schema := pgtest.Schema(t, observer)
	ctx := testCtx(t)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})

	held, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	got := acquireLater(ctx, m, "r")
	waitForListener(t, pool, observer)

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, held.Release(rctx), "the holder's release gets the pool's one connection")
	requireAcquired(t, got, "the waiter is woken and acquires", "the waiter never acquired")
	assert.Zero(t, pool.Stat().AcquiredConns())
	assertNoListeners(t, pool)
}

// Issue 11 item 3: a try never waits on a row lock longer than
// TryLockTimeout. An unrelated transaction that updated the leased row (or
// locked the resource's counter row) and has not committed makes the try
// report busy, while that transaction is still open.
func TestTryDoesNotWaitBehindUnrelatedTransaction(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	col := usersTable(t, p1, schema, time.Minute, 1)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	l, err := m.TryAcquire(ctx, "r", nil) // creates the resource's counter row
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	for name, lockSQL := range map[string]string{
		"column":  "UPDATE " + pgx.Identifier{schema, "users"}.Sanitize() + " SET auth_id = 'x' WHERE id = 1",
		"manager": "SELECT 1 FROM " + pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize() + " WHERE resource = 'r' FOR UPDATE",
	} {
		t.Run(name, func(t *testing.T) {
			tx, err := p2.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(context.WithoutCancel(ctx))
			_, err = tx.Exec(ctx, lockSQL)
			require.NoError(t, err)

			tctx, cancel := context.WithTimeout(ctx, 5*time.Second) // far above TryLockTimeout
			defer cancel()
			if name == "column" {
				_, err = col.TryAcquire(tctx, int64(1))
			} else {
				_, err = m.TryAcquire(tctx, "r", nil)
			}
			require.ErrorIs(t, err, lease.ErrNotAcquired, "busy, not a timeout of the caller's context")
			require.NoError(t, tctx.Err(), "the try returned before its context ended")
			var one int
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the other transaction is still open")
		})
	}
}

// Issue 11 item 3: through a frozen network, an Acquire with a 1s context
// returned after 16s (give-back, UNLISTEN and close, each bounded by
// ReleaseTimeout, in series). It must return within its deadline plus one
// ReleaseTimeout.
func TestAcquireDeadlineThroughFrozenNetwork(t *testing.T) {
	const deadline, releaseTimeout = time.Second, 2 * time.Second
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	holder := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	held, err := holder.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	defer held.Release(context.WithoutCancel(ctx))

	proxy := newFreezeProxy(t, p1.Config().ConnConfig.Host, p1.Config().ConnConfig.Port)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = proxy.host, proxy.port
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	via := pgtest.NewPool(t, cfg)
	t.Cleanup(func() { proxy.frozen.Store(false) }) // runs before the pool's checks
	m, err := lease.NewManager(via, lease.ManagerConfig{Schema: schema, TTL: time.Minute,
		PollInterval: 200 * time.Millisecond, ReleaseTimeout: releaseTimeout})
	require.NoError(t, err)

	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := m.Acquire(actx, "r", nil)
		got <- err
	}()
	waitForListener(t, via, p1)
	proxy.frozen.Store(true)
	var aerr error
	select {
	case aerr = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire did not return")
	}
	took := time.Since(start)
	t.Logf("Acquire returned after %v: %v", took, aerr)
	require.ErrorIs(t, aerr, lease.ErrNotAcquired)
	require.ErrorIs(t, aerr, context.DeadlineExceeded)
	// The bound is deadline + one ReleaseTimeout; the slack is for a loaded
	// machine, and is below the second ReleaseTimeout a serial clean-up adds.
	assert.Less(t, took, deadline+releaseTimeout+releaseTimeout*3/4)
}

// freezeProxy forwards TCP connections to PostgreSQL until frozen is set;
// from then on it drops every byte in both directions and forwards no new
// connection, keeping sockets open: a silent partition.
type freezeProxy struct {
	host   string
	port   uint16
	frozen atomic.Bool
}

func newFreezeProxy(t *testing.T, host string, port uint16) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezeProxy{host: "127.0.0.1", port: uint16(ln.Addr().(*net.TCPAddr).Port)}
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
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.frozen.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if !p.frozen.Load() {
					dst.Close()
				}
				return
			}
		}
	}
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, client)
			mu.Unlock()
			if p.frozen.Load() {
				wg.Go(func() { _, _ = io.Copy(io.Discard, client) })
				continue
			}
			server, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			open = append(open, server)
			mu.Unlock()
			wg.Go(func() { pipe(server, client) })
			wg.Go(func() { pipe(client, server) })
		}
	})
	return p
}

// Review 15b: the LISTEN connection copied the pool's whole connection
// config, OnNotification handler included; with one set, pgx hands every
// notification to it and WaitForNotification returns none (nil, nil), and
// the listener dereferenced it: the first release notified on the channel
// crashed the process. The waiter must be woken by the notification (the
// poll interval is an hour), and the pool's handler never sees the
// listener's notifications.
func TestListenerIgnoresThePoolsOnNotificationHandler(t *testing.T) {
	cfg := pgtest.Config(t)
	var seen atomic.Int32
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { seen.Add(1) }
	pool := pgtest.NewPool(t, cfg)
	observer := pgtest.Pool(t)
	schema := pgtest.Schema(t, observer)
	ctx := testCtx(t)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})

	held, err := m.TryAcquire(ctx, "r", nil)
	require.NoError(t, err)
	got := acquireLater(ctx, m, "r")
	waitForListener(t, pool, observer)
	require.NoError(t, held.Release(ctx))
	requireAcquired(t, got, "the waiter is woken by the release's notification and acquires", "the waiter was never woken")
	assert.Zero(t, seen.Load(), "the pool's handler got the listener's notifications")
	assertNoListeners(t, pool)
}

// Review 15b: on a connection whose client_encoding is not UTF8, List and
// ListIntents run their query in a transaction (see utf8SQL), and its
// ROLLBACK ran under a context nothing bounded: a network gone silent right
// then held the call forever. It is bounded by ReleaseTimeout now, the
// connection closed (and not pooled) when it passes.
func TestListRollbackOfAFrozenNetworkIsBounded(t *testing.T) {
	direct := pgtest.Pool(t)
	schema := pgtest.Schema(t, direct)
	cc := direct.Config().ConnConfig
	proxy, err := tcpproxy.New("tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	cfg := pgtest.Config(t)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(proxy.Port())
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil // the proxy must read the statements
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "LATIN1"
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	mcfg := lease.ManagerConfig{TTL: time.Minute, ReleaseTimeout: time.Second}
	newManager(t, direct, schema, mcfg)
	m := newManager(t, pool, schema, mcfg)
	ctx := testCtx(t)
	for _, list := range []struct {
		name string
		call func(context.Context) error
	}{
		{"List", func(ctx context.Context) error { _, err := m.List(ctx, nil); return err }},
		{"ListIntents", func(ctx context.Context) error { _, err := m.ListIntents(ctx, nil); return err }},
	} {
		t.Run(list.name, func(t *testing.T) {
			proxy.Swallow(nil)
			require.NoError(t, list.call(ctx)) // the pool's connection, LATIN1, is open
			proxy.Swallow([]byte("rollback"))
			done := make(chan error, 1)
			go func() { done <- list.call(ctx) }()
			select {
			case <-done: // the rows were read; the ROLLBACK's bound passed
			case <-time.After(time.Minute): // a guard against the hang, not a budget
				proxy.Cut()
				t.Fatal("List did not return while its ROLLBACK went unanswered")
			}
			// pgxpool destroys a closed connection in the background
			assert.Eventually(t, func() bool { return pool.Stat().TotalConns() == 0 }, 10*time.Second, time.Millisecond,
				"the connection whose ROLLBACK went unanswered is destroyed, not pooled")
		})
	}
}

// listenPanicTracer is a pgx QueryTracer and ConnectTracer that panics,
// once armed, at the start of a LISTEN and at the end of a connect.
type listenPanicTracer struct{ armed atomic.Bool }

func (p *listenPanicTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "LISTEN ") && p.armed.CompareAndSwap(true, false) {
		panic("listen tracer bug")
	}
	return ctx
}

func (*listenPanicTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *listenPanicTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

func (p *listenPanicTracer) TraceConnectEnd(_ context.Context, d pgx.TraceConnectEndData) {
	if d.Err == nil && p.armed.CompareAndSwap(true, false) {
		panic("connect tracer bug")
	}
}

// Review 16 and 17: the LISTEN connection is opened and used on the
// listener's own goroutine, with the pool config's Tracer and connect
// hooks. A Tracer that panicked there ended the process; once that was
// recovered, a hook that panicked after the session was up
// (TraceConnectEnd, pgconn's AfterConnect or ValidateConnect) left a
// server session nothing closed, one per retry. Now the Tracer is not used
// on that connection, and a panic of those hooks is their error, on which
// pgconn closes the connection: the waiter gets the lease, and once it has
// left no session of the pool's application is open but the pool's own.
func TestListenerSurvivesPanickingHooks(t *testing.T) {
	for _, hook := range []string{"Tracer", "AfterConnect", "ValidateConnect", "AfterNetConnect", "BuildFrontend", "ContextWatcher"} {
		t.Run(hook, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			var armed atomic.Bool
			var panics atomic.Int32
			boom := func(context.Context, *pgconn.PgConn) error {
				if armed.Load() {
					panics.Add(1)
					panic("connect hook bug")
				}
				return nil
			}
			tr := &listenPanicTracer{}
			var cancels atomic.Int32
			switch hook {
			case "Tracer":
				cfg.ConnConfig.Tracer = tr
			case "AfterConnect":
				cfg.ConnConfig.AfterConnect = boom
			case "ValidateConnect":
				cfg.ConnConfig.ValidateConnect = boom
			case "AfterNetConnect": // before the startup message: a socket, no session yet
				cfg.ConnConfig.AfterNetConnect = func(ctx context.Context, _ *pgconn.Config, nc net.Conn) (net.Conn, error) {
					if armed.Load() {
						panics.Add(1)
						panic("connect hook bug")
					}
					return nc, nil
				}
			case "BuildFrontend":
				build := cfg.ConnConfig.BuildFrontend
				cfg.ConnConfig.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
					if armed.Load() {
						panics.Add(1)
						panic("connect hook bug")
					}
					return build(r, w)
				}
			case "ContextWatcher": // its HandleCancel would run on pgconn's own goroutine
				build := cfg.ConnConfig.BuildContextWatcherHandler
				cfg.ConnConfig.BuildContextWatcherHandler = func(pg *pgconn.PgConn) ctxwatch.Handler {
					return &panickyWatcher{Handler: build(pg), armed: &armed, cancels: &cancels}
				}
			}
			pool := pgtest.NewPool(t, cfg)
			observer := pgtest.Pool(t)
			schema := pgtest.Schema(t, observer)
			ctx := testCtx(t)
			m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 100 * time.Millisecond})
			held, err := m.TryAcquire(ctx, "r", nil) // the pool's one connection is up: only the listener dials now
			require.NoError(t, err)
			tr.armed.Store(true)
			armed.Store(true)
			got := acquireLater(ctx, m, "r")
			fds := openSockets(t)
			if hook == "Tracer" || hook == "ContextWatcher" {
				waitForListener(t, pool, observer)
				assert.True(t, tr.armed.Load(), "the pool's Tracer is not used on the LISTEN connection")
			} else {
				require.Eventually(t, func() bool { return panics.Load() >= 3 }, 20*time.Second, time.Millisecond,
					"the listener retries after each failed connect")
				// each failed connect's session was closed with it (one
				// connect may be under way)
				app := pool.Config().ConnConfig.RuntimeParams["application_name"]
				n := queryOne[int](t, observer, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app)
				assert.LessOrEqual(t, n, int(pool.Stat().TotalConns())+1, "sessions of failed connects are left open")
				assert.LessOrEqual(t, openSockets(t), fds+1, "sockets of failed connects are left open")
				armed.Store(false)
				waitForListener(t, pool, observer)
			}
			require.NoError(t, held.Release(ctx))
			requireAcquired(t, got, "the waiter gets the lease", "the waiter never got the lease")
			app := pool.Config().ConnConfig.RuntimeParams["application_name"]
			assert.Eventually(t, func() bool {
				return queryOne[int](t, observer, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == int(pool.Stat().TotalConns())
			}, 20*time.Second, 5*time.Millisecond, "no session of the failed connects is left open")
			assertNoListeners(t, pool)
			assert.Zero(t, cancels.Load(), "the pool's context watcher handler is not used on the LISTEN connection")
		})
	}
}

// panickyWatcher is a pgconn context watcher handler whose HandleCancel
// panics while armed.
type panickyWatcher struct {
	ctxwatch.Handler
	armed   *atomic.Bool
	cancels *atomic.Int32
}

func (w *panickyWatcher) HandleCancel(ctx context.Context) {
	if w.armed.Load() {
		w.cancels.Add(1)
		panic("context watcher bug")
	}
	w.Handler.HandleCancel(ctx)
}

// openSockets counts the process's open sockets (Linux; elsewhere 0).
func openSockets(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}
