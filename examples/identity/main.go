// Command identity shows a lease for a critical section that calls the outside world:
// "switch primary identity", two calls to an identity provider (unlink, then link the
// other way round) plus a local update, for one user at a time.
//
// The lease is a column lease on the users row (lease.Column on
// users.identity_action_locked_at): one committed UPDATE claims it, another releases it,
// and no database connection or transaction is held while the provider is called. The
// program runs the same switch four ways against a fake provider (httptest, in process):
//   - no lock at all: concurrent switches interleave and corrupt the provider's state;
//   - one transaction with SELECT ... FOR UPDATE across the calls (the @Transactional
//     reflex): consistent, but every switch holds a connection during its HTTP calls;
//   - the column lease: 50 concurrent requests, one switch at a time, the others refused
//     with 409 Conflict; no connection held during the calls;
//   - fencing: a holder that stalls past its TTL cannot write over its successor.
//
// Run it with:
//
//	go run ./examples/identity
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/lease"
)

const userID int64 = 1

type config struct {
	URL      string
	Requests int           // concurrent switch requests per round
	Rounds   int           // rounds of the lease phase
	TTL      time.Duration // lease TTL
}

// result is what the run observed, for the test.
type result struct {
	UnprotectedCorrupted  bool
	TxCalls, TxHeldCalls  int64 // provider calls in phase 2, and those made holding a connection
	Switched, Conflicts   int64 // phase 3: switches done, requests refused
	LeaseCalls, HeldCalls int64 // phase 3: provider calls, and those made holding a connection
	Consistent            bool  // phase 3 and 4: provider and database agreed after every round
	StaleRenew, StaleSave error // phase 4: what the stalled holder got
	StaleToken, NewToken  int64
}

func main() {
	cfg := config{URL: os.Getenv(exampledb.EnvURL)}
	flag.IntVar(&cfg.Requests, "requests", 50, "concurrent switch requests per round")
	flag.IntVar(&cfg.Rounds, "rounds", 5, "rounds of concurrent requests under the lease")
	flag.DurationVar(&cfg.TTL, "ttl", time.Second, "lease TTL (short, so that phase 4 is quick; "+
		"in production: above the worst case of the provider calls with their retries)")
	flag.Parse()
	exampledb.Main("identity", func(ctx context.Context) error {
		res, err := run(ctx, cfg, os.Stdout)
		if err == nil && !res.Consistent {
			err = errors.New("the provider and the database disagree")
		}
		return err
	})
}

// service is the application side: the users table, the lease on its rows, and the
// provider's client.
type service struct {
	pool     *pgxpool.Pool
	col      *lease.Column
	fence    *lease.Fence
	provider partnerClient
}

// switchPrimary is the pattern. TryDo claims the row with one committed UPDATE ... WHERE
// identity_action_locked_at IS NULL OR ... < now() - TTL, runs the callback, and releases
// with another UPDATE scoped to this claim. Meanwhile it renews the lease in the
// background and cancels the callback's context if the lease is lost. A second request
// for the same user gets lease.ErrNotAcquired at once (an HTTP handler answers 409).
func (s *service) switchPrimary(ctx context.Context) (token int64, err error) {
	// Demo instrumentation: the lease's own statements (claim, background renewals,
	// release) are tagged apart from the request's, so that a renewal that happens to
	// run during a provider call is not counted as the request holding a connection.
	id := requestID(ctx)
	err = s.col.TryDo(withRequest(ctx, "lease:"+id), userID, nil, func(ctx context.Context, l *lease.ColumnLease) error {
		token = l.Token()
		return s.switchUnder(withRequest(ctx, id), l)
	})
	return token, err
}

// switchUnder does the switch while l is held: no transaction, no pinned connection;
// each statement borrows a pooled connection for its own round trip only.
func (s *service) switchUnder(ctx context.Context, l *lease.ColumnLease) error {
	var current string // read under the lease, so no other switch can make it stale
	if err := s.pool.QueryRow(ctx, `SELECT auth_id FROM users WHERE id = $1`, userID).Scan(&current); err != nil {
		return err
	}
	target := other(current)
	if err := s.provider.call(ctx, "unlink", current, target); err != nil {
		return err
	}
	if err := s.provider.call(ctx, "link", target, current); err != nil {
		return err
	}
	// The local write is fenced: it succeeds only if no later lease holder has written
	// (users.auth_fence <= our token), and records our token.
	return s.fence.Update(ctx, s.pool, userID, l.Token(), map[string]any{"auth_id": target})
}

// switchUnprotected is the bug: the same steps with nothing keeping a second switch of
// the same user out.
func (s *service) switchUnprotected(ctx context.Context) error {
	var current string
	if err := s.pool.QueryRow(ctx, `SELECT auth_id FROM users WHERE id = $1`, userID).Scan(&current); err != nil {
		return err
	}
	if err := s.provider.call(ctx, "unlink", current, other(current)); err != nil {
		return err
	}
	if err := s.provider.call(ctx, "link", other(current), current); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `UPDATE users SET auth_id = $2 WHERE id = $1`, userID, other(current))
	return err
}

// switchInTransaction is the @Transactional reflex: correct, but it holds a connection
// and a row lock for as long as the provider takes, retries included; every concurrent
// request for the user waits on the database holding a connection of its own.
func (s *service) switchInTransaction(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var current string
		if err := tx.QueryRow(ctx, `SELECT auth_id FROM users WHERE id = $1 FOR UPDATE`, userID).Scan(&current); err != nil {
			return err
		}
		if err := s.provider.call(ctx, "unlink", current, other(current)); err != nil {
			return err
		}
		if err := s.provider.call(ctx, "link", other(current), current); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE users SET auth_id = $2 WHERE id = $1`, userID, other(current))
		return err
	})
}

func run(ctx context.Context, cfg config, out io.Writer) (res result, err error) {
	db, err := exampledb.Open(ctx, cfg.URL, os.Stderr)
	if err != nil {
		return res, err
	}
	defer db.Close()

	// Count, at every provider call, whether the calling request holds a connection.
	tracker := newConnTracker()
	var calls, heldCalls atomic.Int64
	api := newPartner()
	api.onCall = func(r *http.Request) {
		calls.Add(1)
		if tracker.held(r.Header.Get("X-Request-Id")) > 0 {
			heldCalls.Add(1)
		}
	}
	srv := httptest.NewServer(api)
	defer srv.Close()

	pool, err := db.Pool(ctx, exampledb.PoolOptions{
		AppName: "pgxlock-example-identity", MaxConns: 4, Schema: "pgxlock_example_identity",
		Configure: func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracker },
	})
	if err != nil {
		return res, err
	}
	defer pool.Close()
	s, err := setup(ctx, pool, partnerClient{base: srv.URL, http: srv.Client()}, cfg.TTL)
	if err != nil {
		return res, err
	}
	check := func() error {
		primary, err := api.primary()
		if err != nil {
			return fmt.Errorf("provider: %w", err)
		}
		var local string
		if err := pool.QueryRow(ctx, `SELECT auth_id FROM users WHERE id = $1`, userID).Scan(&local); err != nil {
			return err
		}
		if local != primary {
			return fmt.Errorf("the provider's primary is %s, the database says %s", primary, local)
		}
		return nil
	}
	reset := func() error {
		api.reset()
		_, err := pool.Exec(ctx, `UPDATE users SET auth_id = $2 WHERE id = $1`, userID, identityA)
		return err
	}
	// burst runs n requests arriving within 20ms of each other.
	burst := func(n int, fn func(ctx context.Context) error) error {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				time.Sleep(rand.N(20 * time.Millisecond)) // arrival time
				errs[i] = fn(withRequest(ctx, fmt.Sprintf("req-%d", i)))
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	say("user %d has two identities at the provider; primary %s, %s linked under it", userID, identityA, identityB)
	say("each round: %d concurrent \"switch primary identity\" requests for user %d\n", cfg.Requests, userID)

	say("1. no lock")
	for round := 1; round <= 10 && !res.UnprotectedCorrupted; round++ {
		if err := burst(cfg.Requests, s.switchUnprotected); err != nil {
			return res, err
		}
		if err := check(); err != nil {
			say("   round %d: CORRUPTED: %v", round, err)
			res.UnprotectedCorrupted = true
		} else {
			say("   round %d: consistent, by luck", round)
		}
	}
	if err := reset(); err != nil {
		return res, err
	}

	say("\n2. one transaction, SELECT ... FOR UPDATE, across the provider calls")
	c0, h0, t0 := calls.Load(), heldCalls.Load(), time.Now()
	if err := burst(cfg.Requests, s.switchInTransaction); err != nil {
		return res, err
	}
	res.TxCalls, res.TxHeldCalls = calls.Load()-c0, heldCalls.Load()-h0
	say("   %d switches in %v: %v", cfg.Requests, time.Since(t0).Round(time.Millisecond), verdict(check()))
	say("   provider calls made while holding a database connection: %d of %d", res.TxHeldCalls, res.TxCalls)

	say("\n3. column lease on users.identity_action_locked_at (TTL %v)", cfg.TTL)
	res.Consistent = true
	c0, h0 = calls.Load(), heldCalls.Load()
	for round := 1; round <= cfg.Rounds; round++ {
		var tokens []int64
		var mu sync.Mutex
		err := burst(cfg.Requests, func(ctx context.Context) error {
			token, err := s.switchPrimary(ctx)
			if errors.Is(err, lease.ErrNotAcquired) {
				atomic.AddInt64(&res.Conflicts, 1) // 409 Conflict: another switch is in progress
				return nil
			}
			if err == nil {
				atomic.AddInt64(&res.Switched, 1)
				mu.Lock()
				tokens = append(tokens, token)
				mu.Unlock()
			}
			return err
		})
		if err != nil {
			return res, err
		}
		cerr := check()
		res.Consistent = res.Consistent && cerr == nil
		slices.Sort(tokens)
		say("   round %d: %d switched, one at a time (fencing tokens %v); %d refused with 409 Conflict: %v",
			round, len(tokens), tokens, cfg.Requests-len(tokens), verdict(cerr))
	}
	res.LeaseCalls, res.HeldCalls = calls.Load()-c0, heldCalls.Load()-h0
	say("   provider calls made while holding a database connection: %d of %d (pool of %d connections)",
		res.HeldCalls, res.LeaseCalls, pool.Config().MaxConns)

	say("\n4. fencing: a holder that stalls past its TTL")
	if err := stale(ctx, s, cfg.TTL, &res, say); err != nil {
		return res, err
	}
	cerr := check()
	res.Consistent = res.Consistent && cerr == nil
	say("   %v", verdict(cerr))
	return res, nil
}

// stale shows what the fencing token is for. A acquires the lease and stalls (a long GC
// pause, a frozen VM) without renewing; its lease expires; B takes over with a larger
// token and switches. When A wakes up, a renewal tells it that it lost the lease, and a
// write it makes anyway is refused because the row carries B's larger token.
// (TryDo does the renewal check for you: after a stall its trust window has closed and
// the callback's context is cancelled.)
func stale(ctx context.Context, s *service, ttl time.Duration, res *result, say func(string, ...any)) error {
	ctx = withRequest(ctx, "stale")
	a, err := s.col.TryAcquire(ctx, userID)
	if err != nil {
		return err
	}
	res.StaleToken = a.Token()
	say("   A acquired the lease: fencing token %d; then A stalls and stops renewing", a.Token())

	// B tries now and then, as new requests would, until A's lease has run out on the
	// database's clock.
	t0 := time.Now()
	var b *lease.ColumnLease
	for b == nil {
		b, err = s.col.TryAcquire(ctx, userID)
		if err != nil && !errors.Is(err, lease.ErrNotAcquired) {
			return err
		}
		if time.Since(t0) > 10*ttl {
			return fmt.Errorf("the stalled lease did not expire within %v", 10*ttl)
		}
		if b == nil {
			time.Sleep(ttl / 10)
		}
	}
	res.NewToken = b.Token()
	say("   B acquired the lease %v later, when A's had expired: fencing token %d", time.Since(t0).Round(10*time.Millisecond), b.Token())
	if err := s.switchUnder(ctx, b); err != nil {
		return err
	}
	if err := b.Release(ctx); err != nil {
		return err
	}
	say("   B switched the primary and wrote it with token %d", b.Token())

	res.StaleRenew = a.Renew(ctx)
	say("   A wakes up; A renews: %v  -> A must not call the provider", res.StaleRenew)
	res.StaleSave = s.fence.Update(ctx, s.pool, userID, a.Token(), map[string]any{"auth_id": identityA})
	say("   A writes anyway with token %d: %v  -> refused, the row carries token %d", a.Token(), res.StaleSave, b.Token())
	say("   A releases: %v  -> nothing of B's is touched", a.Release(ctx))
	return nil
}

// setup creates users(1) and the lease columns, from scratch on every run.
func setup(ctx context.Context, pool *pgxpool.Pool, provider partnerClient, ttl time.Duration) (*service, error) {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS users`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE users (
		id         bigint PRIMARY KEY,
		auth_id    text   NOT NULL,
		auth_fence bigint NOT NULL DEFAULT 0)`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO users (id, auth_id) VALUES ($1, $2)`, userID, identityA); err != nil {
		return nil, err
	}
	// The lease columns are not part of the User entity: only the lease's own statements
	// touch them, so no ORM save can overwrite a lease it read before.
	col, err := lease.NewColumn(pool, lease.ColumnConfig{
		Table:          "users",
		LockedAtColumn: "identity_action_locked_at",
		OwnerColumn:    "identity_action_locked_by",
		FenceColumn:    "identity_action_fence",
		TTL:            ttl,
	})
	if err != nil {
		return nil, err
	}
	if err := col.Migrate(ctx); err != nil {
		return nil, err
	}
	fence, err := lease.NewFence(lease.FenceConfig{Table: "users", TokenColumn: "auth_fence"})
	if err != nil {
		return nil, err
	}
	return &service{pool: pool, col: col, fence: fence, provider: provider}, nil
}

func verdict(err error) string {
	if err != nil {
		return "CORRUPTED: " + err.Error()
	}
	return "provider and database agree"
}
