// Command tenant shows transaction-level advisory locks serialising work per tenant:
// concurrent balance transfers, each in one database transaction that first takes its
// tenant's lock. A transfer between two tenants takes both locks in one call, which sorts
// them, so two opposite transfers never deadlock (no SQLSTATE 40P01).
//
// The transfer code reads balances, decides in Go and writes the new values back, as
// business logic usually does. Without the lock that loses updates under concurrency;
// run with --no-lock to watch the totals drift and deadlocks appear.
//
//	go run ./examples/tenant
//	go run ./examples/tenant --no-lock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/keys"
)

// tenantNS holds one exact key per tenant id: ns:tenant(1002)/<id> in logs and pg_locks.
var tenantNS = keys.MustRegisterNamespace(1002, "tenant")

type config struct {
	URL       string
	Tenants   int     // tenants, each with Accounts accounts
	Accounts  int     // accounts per tenant
	Workers   int     // concurrent transfer loops
	Transfers int     // transfers in total
	Cross     float64 // share of transfers between two tenants
	NoLock    bool    // skip the advisory locks (to see what goes wrong)
}

// result is what the run observed.
type result struct {
	Before, After   int64 // sum of all balances
	Done, Declined  int64 // transfers committed / refused for lack of funds
	Cross           int64 // committed transfers between two tenants
	Deadlocks       int64 // transfers that failed with 40P01 (only without the lock)
	Negative        int64 // accounts below zero at the end
	MaxPerTenant    int64 // most transfers seen inside one tenant's critical section at once
	OtherErrorsSeen int64 // other failed transfers (only without the lock)
}

func main() {
	cfg := config{URL: os.Getenv(exampledb.EnvURL)}
	flag.IntVar(&cfg.Tenants, "tenants", 4, "tenants")
	flag.IntVar(&cfg.Accounts, "accounts", 5, "accounts per tenant")
	flag.IntVar(&cfg.Workers, "workers", 16, "concurrent workers")
	flag.IntVar(&cfg.Transfers, "transfers", 2000, "transfers in total")
	flag.Float64Var(&cfg.Cross, "cross", 0.3, "share of transfers between two tenants")
	flag.BoolVar(&cfg.NoLock, "no-lock", false, "run the same transactions without advisory locks")
	flag.Parse()
	exampledb.Main("tenant", func(ctx context.Context) error {
		res, err := run(ctx, cfg, os.Stdout)
		if err == nil && (res.After != res.Before || res.Negative > 0) {
			err = errors.New("balances are inconsistent")
		}
		return err
	})
}

func run(ctx context.Context, cfg config, out io.Writer) (result, error) {
	var res result
	db, err := exampledb.Open(ctx, cfg.URL, os.Stderr)
	if err != nil {
		return res, err
	}
	defer db.Close()
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-tenant", MaxConns: int32(cfg.Workers), Schema: "pgxlock_example_tenant"})
	if err != nil {
		return res, err
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return res, err
	}
	if err := setup(ctx, pool, cfg); err != nil {
		return res, err
	}
	if res.Before, err = total(ctx, pool); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "%d tenants x %d accounts, total balance %d; %d transfers by %d workers, %.0f%% across tenants, lock: %v\n",
		cfg.Tenants, cfg.Accounts, res.Before, cfg.Transfers, cfg.Workers, cfg.Cross*100, !cfg.NoLock)

	b := &bank{locker: locker, pool: pool, noLock: cfg.NoLock, inside: map[int]int64{}}
	var next atomic.Int64
	errs := make([]error, cfg.Workers)
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Go(func() {
			for next.Add(1) <= int64(cfg.Transfers) && ctx.Err() == nil {
				from := account{rand.IntN(cfg.Tenants) + 1, rand.IntN(cfg.Accounts) + 1}
				to := account{from.tenant, rand.IntN(cfg.Accounts) + 1}
				if cfg.Tenants > 1 && rand.Float64() < cfg.Cross {
					to.tenant = (from.tenant+rand.IntN(cfg.Tenants-1))%cfg.Tenants + 1 // another tenant
				}
				ok, err := b.transfer(ctx, from, to, int64(rand.IntN(300)+1))
				switch {
				case isDeadlock(err):
					atomic.AddInt64(&res.Deadlocks, 1) // counted, to show there are none with the lock
				case err != nil && cfg.NoLock:
					atomic.AddInt64(&res.OtherErrorsSeen, 1)
				case err != nil:
					errs[w] = err
					return
				case !ok:
					atomic.AddInt64(&res.Declined, 1)
				default:
					atomic.AddInt64(&res.Done, 1)
					if from.tenant != to.tenant {
						atomic.AddInt64(&res.Cross, 1)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.After, err = total(ctx, pool); err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM tenant_accounts WHERE balance < 0`).Scan(&res.Negative); err != nil {
		return res, err
	}
	res.MaxPerTenant = b.maxInside

	fmt.Fprintf(out, "transfers: %d committed (%d across tenants), %d declined for insufficient funds\n",
		res.Done, res.Cross, res.Declined)
	fmt.Fprintf(out, "most transfers inside one tenant at once: %d\n", res.MaxPerTenant)
	fmt.Fprintf(out, "deadlocks (40P01): %d, other failed transfers: %d, negative balances: %d\n",
		res.Deadlocks, res.OtherErrorsSeen, res.Negative)
	verdict := "consistent"
	if res.After != res.Before || res.Negative > 0 {
		verdict = fmt.Sprintf("INCONSISTENT: %+d appeared from nowhere", res.After-res.Before)
	}
	fmt.Fprintf(out, "total balance before %d, after %d: %s\n", res.Before, res.After, verdict)
	return res, nil
}

type account struct{ tenant, id int }

// bank moves money. It counts how many transfers are inside each tenant's critical
// section at once, to show the serialisation (always 1 with the lock).
type bank struct {
	locker *advisory.Locker
	pool   *pgxpool.Pool
	noLock bool

	mu        sync.Mutex
	inside    map[int]int64 // tenant -> transfers running
	maxInside int64
}

// transfer moves amount between two accounts in one transaction holding the lock of
// every tenant involved. It reports false when the source account lacks the funds.
func (b *bank) transfer(ctx context.Context, from, to account, amount int64) (ok bool, err error) {
	fn := func(ctx context.Context, tx pgx.Tx) error {
		defer b.enter(from.tenant, to.tenant)()
		var balance int64
		if err := tx.QueryRow(ctx, `SELECT balance FROM tenant_accounts WHERE tenant_id = $1 AND account_id = $2`,
			from.tenant, from.id).Scan(&balance); err != nil {
			return err
		}
		if balance < amount {
			return nil // declined; ok stays false
		}
		// Read, decide, write back: safe only because nobody else works on these
		// tenants until this transaction ends.
		if err := b.add(ctx, tx, from, -amount); err != nil {
			return err
		}
		ok = true
		return b.add(ctx, tx, to, amount)
	}
	if b.noLock {
		return ok, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
	}
	// READ COMMITTED whatever the database's default: the lock is the transaction's
	// first statement, and under REPEATABLE READ or SERIALIZABLE its snapshot would
	// be taken before it waits, so fn would read the balances as they were before
	// the previous holder's transfer (see "Isolation" in package advisory).
	opts := &advisory.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.ReadCommitted}}
	if from.tenant == to.tenant {
		return ok, b.locker.WithXactLock(ctx, tenantNS.Key(int32(from.tenant)), opts, fn)
	}
	// Both tenants in one call, in whatever order: WithXactLockAll sorts the keys, so a
	// transfer 1->2 and a transfer 2->1 queue up instead of deadlocking.
	return ok, b.locker.WithXactLockAll(ctx,
		[]keys.Key{tenantNS.Key(int32(from.tenant)), tenantNS.Key(int32(to.tenant))}, opts, fn)
}

// add changes one balance the way application code often does: read, compute, write.
func (b *bank) add(ctx context.Context, tx pgx.Tx, a account, delta int64) error {
	var balance int64
	if err := tx.QueryRow(ctx, `SELECT balance FROM tenant_accounts WHERE tenant_id = $1 AND account_id = $2`,
		a.tenant, a.id).Scan(&balance); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE tenant_accounts SET balance = $3 WHERE tenant_id = $1 AND account_id = $2`,
		a.tenant, a.id, balance+delta)
	return err
}

// enter records a transfer inside the given tenants' critical sections; the returned
// function records its exit.
func (b *bank) enter(tenants ...int) func() {
	if tenants[0] == tenants[1] {
		tenants = tenants[:1]
	}
	b.mu.Lock()
	for _, t := range tenants {
		b.inside[t]++
		b.maxInside = max(b.maxInside, b.inside[t])
	}
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		for _, t := range tenants {
			b.inside[t]--
		}
		b.mu.Unlock()
	}
}

func setup(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	// A fresh table on every run: the demo starts from the same balances each time.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS tenant_accounts;
			CREATE TABLE tenant_accounts (
				tenant_id  int    NOT NULL,
				account_id int    NOT NULL,
				balance    bigint NOT NULL,
				PRIMARY KEY (tenant_id, account_id))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_accounts
			SELECT t, a, 1000 FROM generate_series(1, $1::int) t, generate_series(1, $2::int) a`,
			cfg.Tenants, cfg.Accounts)
		return err
	})
}

func total(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var sum int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM tenant_accounts`).Scan(&sum)
	return sum, err
}

// isDeadlock reports SQLSTATE 40P01, whether the library mapped it (advisory.ErrDeadlock)
// or a row lock raised it.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, advisory.ErrDeadlock) || (errors.As(err, &pgErr) && pgErr.Code == "40P01")
}
