package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/pooltx"
)

// Acquire waits until the lease can be had, or ctx ends.
//
// It makes one attempt at once; if that fails it subscribes to the manager's
// NOTIFY channel and tries again whenever a release, give-back or sweep of
// this resource is notified, and otherwise after a jittered PollInterval
// (or sooner, when the database says the blocking lease expires sooner: a
// lease that expires sends no notification). An Exclusive request blocked by
// readers registers a writer intent that keeps new Shared acquisitions out
// until it is granted or abandoned (see the package docs). All waiting Acquire calls
// of one Manager share one dedicated LISTEN connection (not from the pool);
// attempts borrow a pooled connection only for their one round trip, so a
// pool of one connection is enough.
//
// ctx governs the whole wait. When it ends, Acquire returns an error
// wrapping both ErrNotAcquired and context.Cause(ctx). An attempt that
// succeeds as ctx ends still returns the lease: success means held. On the
// way out, the clean-up (clearing its writer intent, giving back an attempt
// whose outcome is unknown, closing the LISTEN connection if it was the last
// waiter) runs concurrently under fresh contexts, each bounded by
// ReleaseTimeout: Acquire returns within ctx's deadline plus one
// ReleaseTimeout. Other errors (ErrInvalid, a database error, an attempt
// whose connection failed: a server restart or a failover ends the wait with
// the connection's error, wrapped in an *Error) end the wait.
func (m *Manager) Acquire(ctx context.Context, resource string, opts *AcquireOptions) (*Lease, error) {
	req, err := m.newRequest("acquire", resource, opts)
	if err != nil {
		return nil, err
	}
	ctx = withCleanupClock(ctx)
	l, cleanup, err := m.acquire(ctx, req)
	if cleanup != nil {
		cctx, cancel := cleanupContext(ctx, m.releaseTimeout)
		cleanup(cctx)
		cancel()
	}
	return l, err
}

// acquire is Acquire's wait. A non-nil cleanup is what the caller must run,
// under a bounded context of its own, before reporting the error: giving
// back what the request may hold and closing its subscription. AcquireAll
// runs it concurrently with its other give-backs, under one bound.
func (m *Manager) acquire(ctx context.Context, req *request) (*Lease, func(context.Context), error) {
	resource := req.resource
	if err := ctx.Err(); err != nil {
		return nil, nil, opError(req.op, resource, errors.Join(ErrNotAcquired, context.Cause(ctx)))
	}
	// Fast path: no subscription, no intent.
	l, _, err := m.attempt(ctx, req)
	if !errors.Is(err, ErrNotAcquired) {
		var cleanup func(context.Context)
		if outcomeUnknown(err) {
			cleanup = func(cctx context.Context) { m.giveBack(cctx, req) }
		}
		if err != nil && ctx.Err() != nil { // the failure is the cancellation's doing
			err = opError(req.op, resource, errors.Join(ErrNotAcquired, context.Cause(ctx)))
		}
		return l, cleanup, err
	}
	// Subscribe, then attempt again before the first wait: a release that
	// committed between the fast path and the subscription notified nobody.
	sub := m.lis.subscribe(wakeKey(resource), req.mode == Exclusive)
	if req.mode == Exclusive {
		req.intent = newID()
	}
	for {
		var hint time.Duration
		l, hint, err = m.attempt(ctx, req)
		switch {
		case err == nil:
			sub.close(true)
			return l, nil, nil
		case !errors.Is(err, ErrNotAcquired):
			unknown := outcomeUnknown(err)
			if ctx.Err() != nil { // the failure is the cancellation's doing
				err = opError(req.op, resource, errors.Join(ErrNotAcquired, context.Cause(ctx)))
			}
			return nil, func(cctx context.Context) { m.leave(cctx, req, sub, unknown) }, err
		}
		timer := time.NewTimer(m.pollDelay(hint))
		select {
		case <-sub.wake:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		if ctx.Err() != nil {
			return nil, func(cctx context.Context) { m.leave(cctx, req, sub, false) }, opError(req.op, resource, errors.Join(ErrNotAcquired, context.Cause(ctx)))
		}
	}
}

// leave ends a wait that gives up: it gives back what the request may hold
// in the database (its writer intent, so readers need not wait for it to
// lapse, and the lease of a last attempt whose outcome is unknown) while, at
// the same time, closing the subscription (which may close the LISTEN
// connection). ctx is the caller's clean-up context, already bounded (by
// ReleaseTimeout); closing the subscription has its own bound of
// ReleaseTimeout. They run at the same time, so the bounds are not summed.
func (m *Manager) leave(ctx context.Context, req *request, sub *subscription, unknown bool) {
	if req.intent == "" && !unknown {
		sub.close(false)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { sub.close(false) })
	m.giveBack(ctx, req)
	wg.Wait()
}

// pollDelay picks the next wait: uniform in [poll/2, poll], or just after the
// earliest blocker's expiry (as computed by the database) if that is sooner.
func (m *Manager) pollDelay(hint time.Duration) time.Duration {
	d := m.poll/2 + rand.N(m.poll/2+1)
	if hint > 0 && hint < d {
		// h > 0: a hint within 6 ms of time.Duration's range (a blocker's
		// expiry beyond it saturates to that) must not wrap to a negative
		// wait, which would poll at once, again and again.
		if h := hint + time.Millisecond + rand.N(5*time.Millisecond); h > 0 && h < d {
			d = h
		}
	}
	return d
}

// listener multiplexes one LISTEN connection among all waiting Acquire calls
// of a Manager. Its goroutine runs only while at least one subscription is
// open; the subscriber that closes the last subscription stops it and waits
// for it to finish, so no goroutine outlives the Acquire calls that needed it.
//
// The LISTEN connection is a dedicated pgx.Conn opened from the pool's
// connection config (host, TLS, credentials, runtime parameters; the pool's
// BeforeConnect and AfterConnect hooks are not run, and the config's
// OnNotification handler is dropped: with one set, pgx hands notifications
// to it and WaitForNotification returns none; its Tracer and its
// BuildContextWatcherHandler are not used there (pgconn's deadline
// handler is); a panic of its other hooks there is recovered and counts
// as a failed connection, its sockets closed, retried after a backoff),
// never a pooled one: so
// waiting never takes a connection from the attempts and releases it serves
// (a pool of one connection works), and no connection that has run LISTEN
// ever goes back to the pool. Before LISTEN it turns idle_session_timeout
// off for its session (see listen), whatever the role, the database or the
// config set. It is closed when the last waiter leaves,
// bounded by the cleanup timeout.
//
// Wake-up policy for a notification about a resource: every Shared waiter of
// this process is woken (readers can all get in), but only the longest
// waiting Exclusive one (only one writer can). That keeps a release from
// setting off an attempt by every waiting writer of the process, which would
// all queue on the resource's row lock to learn that one of them won. A
// writer that leaves the queue without the lease passes the wake-up on.
type listener struct {
	pool    *pgxpool.Pool
	channel string // raw name; quoted when sent as an identifier
	backoff time.Duration
	cleanup time.Duration

	mu      sync.Mutex
	subs    map[string][]*subscription // per wake key, in subscription order
	n       int
	running bool
	stop    context.CancelFunc
	done    chan struct{}
}

type subscription struct {
	l         *listener
	key       string
	exclusive bool
	wake      chan struct{} // capacity 1: a pending wake-up is never lost, never duplicated
}

func (s *subscription) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func newListener(pool *pgxpool.Pool, channel string, backoff, cleanup time.Duration) *listener {
	return &listener{pool: pool, channel: channel, backoff: backoff, cleanup: cleanup,
		subs: map[string][]*subscription{}}
}

// subscribe registers interest in key and starts the LISTEN goroutine if it
// is not running. Wake-ups arrive on the subscription's channel: per matching
// notification as described on listener, and to every subscriber each time
// LISTEN (re)starts, because a release committed before LISTEN took effect
// was not seen.
func (l *listener) subscribe(key string, exclusive bool) *subscription {
	s := &subscription{l: l, key: key, exclusive: exclusive, wake: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.subs[key] = append(l.subs[key], s)
	l.n++
	if !l.running {
		ctx, cancel := context.WithCancel(context.Background())
		l.running, l.stop, l.done = true, cancel, make(chan struct{})
		go l.run(ctx, l.done)
	}
	return s
}

// close ends the subscription. A writer that leaves without the lease wakes
// the next writer in line, since it may have consumed the wake-up meant for
// the queue. The last one out stops the goroutine and waits for it (at most
// the cleanup timeout: closing the LISTEN connection).
func (s *subscription) close(granted bool) {
	l := s.l
	l.mu.Lock()
	l.subs[s.key] = slices.DeleteFunc(l.subs[s.key], func(o *subscription) bool { return o == s })
	if len(l.subs[s.key]) == 0 {
		delete(l.subs, s.key)
	} else if s.exclusive && !granted {
		l.wakeLocked(s.key)
	}
	l.n--
	var done chan struct{}
	if l.n == 0 && l.running {
		l.stop()
		l.running, done = false, l.done
	}
	l.mu.Unlock()
	if done != nil {
		<-done
	}
}

// wake applies the wake-up policy to key's subscribers.
func (l *listener) wake(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeLocked(key)
}

func (l *listener) wakeLocked(key string) {
	writer := false
	for _, s := range l.subs[key] {
		if !s.exclusive {
			s.poke()
		} else if !writer {
			s.poke()
			writer = true
		}
	}
}

func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, subs := range l.subs {
		for _, s := range subs {
			s.poke()
		}
	}
}

func (l *listener) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	for {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		_ = err // the connection failed: waiters fall back to polling until LISTEN is back
		l.wakeAll()
		t := time.NewTimer(l.backoff/2 + rand.N(l.backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// recoverHook returns f with a panic of its turned into its error (nil
// stays nil).
func recoverHook(f func(context.Context, *pgconn.PgConn) error) func(context.Context, *pgconn.PgConn) error {
	if f == nil {
		return nil
	}
	return func(ctx context.Context, pg *pgconn.PgConn) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("lease: a connect hook of the pool's config panicked on the LISTEN connection: %v", r)
			}
		}()
		return f(ctx, pg)
	}
}

// listen holds a dedicated connection in LISTEN, with idle_session_timeout
// off, until ctx ends or the connection fails, then closes it (bounded by
// the cleanup timeout): the connection is not pooled, so closing it is all
// the clean-up there is.
func (l *listener) listen(ctx context.Context) (err error) {
	// Every socket this connect dials, so that a panic part-way (a hook's
	// of the pool's connection config: AfterNetConnect, BuildFrontend,
	// OnNotice during startup, ...), which pgconn does not clean up after,
	// closes what it left, session included.
	var mu sync.Mutex
	var dialed []net.Conn
	defer func() {
		// Such a panic runs on the listener's goroutine, where no caller
		// could receive it: it counts as a failed connection (closed,
		// retried after the backoff) instead of ending the process.
		if r := recover(); r != nil {
			mu.Lock()
			for _, nc := range dialed {
				_ = nc.Close()
			}
			mu.Unlock()
			err = fmt.Errorf("lease: a hook of the LISTEN connection panicked: %v", r)
		}
	}()
	cfg := l.pool.Config().ConnConfig // a copy
	cfg.OnNotification = nil          // see above: ours to read
	// The Tracer is not used on this connection; a panic of pgconn's
	// AfterConnect or ValidateConnect is their error, on which pgconn
	// closes the connection; cancellation is pgconn's own deadline handler
	// (a handler of the config's runs on pgconn's watcher goroutine, where
	// its panic could not be recovered).
	cfg.Tracer = nil
	cfg.AfterConnect = recoverHook(cfg.AfterConnect)
	cfg.ValidateConnect = recoverHook(cfg.ValidateConnect)
	cfg.BuildContextWatcherHandler = func(pg *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pg.Conn()}
	}
	dial := cfg.DialFunc
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err == nil {
			mu.Lock()
			dialed = append(dialed, nc)
			mu.Unlock()
		}
		return nc, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := pooltx.CleanupContext(ctx, l.cleanup)
		_ = conn.Close(cctx)
		cancel()
	}()
	// The connection is idle by design between notifications: an
	// idle_session_timeout of the role, the database or the config's
	// runtime parameters (PostgreSQL 14 and later) would have the server
	// end it every timeout (FATAL 57P05), waiters polling until it is back.
	// It is turned off for this session by a statement, not a startup
	// parameter: a server that does not know the setting (before 14) fails
	// a connect that sends it, while its refusal of the statement
	// (undefined_object, 42704) is ignored here. statement_timeout and
	// idle_in_transaction_session_timeout need no such change: waiting for
	// a notification is no statement and is outside any transaction.
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = 0"); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
			return err
		}
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quote(l.channel)); err != nil {
		return err
	}
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n != nil {
			l.wake(n.Payload)
		}
	}
}
