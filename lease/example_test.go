package lease_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/lease"
)

// The seed scenario: switch a user's primary identity at an identity
// provider, a non-atomic pair of HTTP calls, under a column lease on the
// user's row. A second request while the first is in progress is refused
// (an HTTP handler would answer 409 Conflict) instead of interleaving.
func ExampleColumn_TryDo() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	users := pgx.Identifier{schema, "users"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+users+" (id bigint PRIMARY KEY, auth_id text NOT NULL)"); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+users+" VALUES (1, 'google|u1')"); err != nil {
		panic(err)
	}

	// The lease lives in three columns of users, never mapped by an ORM.
	col, err := lease.NewColumn(pool, lease.ColumnConfig{
		Schema: schema, Table: "users",
		LockedAtColumn: "identity_action_locked_at", OwnerColumn: "identity_action_locked_by",
		FenceColumn: "identity_action_fence",
		TTL:         30 * time.Second, // above the worst case of the two calls with their retries
	})
	if err != nil {
		panic(err)
	}
	if err := col.Migrate(ctx); err != nil {
		panic(err)
	}

	api := newPartner()
	srv := httptest.NewServer(api)
	defer srv.Close()
	client := identityClient{base: srv.URL, http: srv.Client()}

	err = col.TryDo(ctx, int64(1), nil, func(ctx context.Context, l *lease.ColumnLease) error {
		// Meanwhile, a double click:
		err := col.TryDo(ctx, int64(1), nil, func(context.Context, *lease.ColumnLease) error { return nil })
		if errors.Is(err, lease.ErrNotAcquired) {
			fmt.Println("second request: 409 Conflict")
		}

		var current string
		if err := pool.QueryRow(ctx, "SELECT auth_id FROM "+users+" WHERE id = 1").Scan(&current); err != nil {
			return err
		}
		target := otherIdentity(current)
		// No connection and no transaction is held during these calls.
		if err := client.call(ctx, "/unlink", current, target); err != nil {
			return err
		}
		if err := client.call(ctx, "/link", target, current); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, "UPDATE "+users+" SET auth_id = $1 WHERE id = 1", target)
		return err
	})
	if err != nil {
		panic(err)
	}
	primary, _ := api.primary()
	fmt.Println("primary at the provider:", primary)
	// Output:
	// second request: 409 Conflict
	// primary at the provider: github|u1
}

// A protected write carries the fencing token and is rejected once a later
// holder has written: a holder that was paused past its TTL cannot undo the
// work of the one that took over.
func ExampleFence_Update() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL, fence_token bigint NOT NULL DEFAULT 0)"); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+accounts+" (id, balance) VALUES (7, 100)"); err != nil {
		panic(err)
	}
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := m.Migrate(ctx); err != nil {
		panic(err)
	}
	fence, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: "accounts"})
	if err != nil {
		panic(err)
	}

	slow, _ := m.TryAcquire(ctx, "account/7", nil)
	// slow pauses past its TTL; another worker takes over once it expires.
	fast, err := m.Acquire(ctx, "account/7", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("tokens:", slow.Token(), fast.Token())
	fmt.Println("fast writes:", fence.Update(ctx, pool, 7, fast.Token(), map[string]any{"balance": 50}))
	err = fence.Update(ctx, pool, 7, slow.Token(), map[string]any{"balance": 0})
	fmt.Println("slow writes:", errors.Is(err, lease.ErrLeaseLost), err)
	_ = fast.Release(ctx)
	// Output:
	// tokens: 1 2
	// fast writes: <nil>
	// slow writes: true lease: fenced update "7": lost
}

// Shared leases for readers, an exclusive one for a writer, on the
// lock-manager table.
func ExampleManager_Acquire() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute, Owner: "editor-1"})
	if err != nil {
		panic(err)
	}
	if err := m.Migrate(ctx); err != nil {
		panic(err)
	}
	shared := &lease.AcquireOptions{Mode: lease.Shared}
	r1, _ := m.Acquire(ctx, "contract/42", shared)
	r2, _ := m.Acquire(ctx, "contract/42", shared)
	fmt.Println("readers:", r1.Token(), r2.Token())

	_, err = m.TryAcquire(ctx, "contract/42", nil)
	fmt.Println("writer while reading:", err)

	holders, _ := m.List(ctx, &lease.ListOptions{Resource: "contract/42"})
	fmt.Println("holders:", len(holders), holders[0].Mode, holders[0].Owner)

	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w, _ := m.Acquire(ctx, "contract/42", nil)
	fmt.Println("writer:", w.Mode(), w.Token())
	_ = w.Release(ctx)
	// Output:
	// readers: 1 2
	// writer while reading: lease: try acquire "contract/42": not acquired
	// holders: 2 shared editor-1
	// writer: exclusive 3
}

// Do renews the lease in the background while the callback runs and releases
// it afterwards; the callback's context ends with ErrLeaseLost as its cause
// if the lease is lost.
func ExampleManager_Do() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Second})
	if err != nil {
		panic(err)
	}
	if err := m.Migrate(ctx); err != nil {
		panic(err)
	}
	err = m.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *lease.Lease) error {
		select {
		case <-time.After(1500 * time.Millisecond): // longer than the TTL: renewals keep the lease
			fmt.Println("report done under token", l.Token())
			return nil
		case <-ctx.Done():
			return context.Cause(ctx) // wraps lease.ErrLeaseLost if the lease was lost
		}
	})
	fmt.Println("err:", err)
	holders, _ := m.List(ctx, &lease.ListOptions{IncludeExpired: true})
	fmt.Println("holders after Do:", len(holders))
	// Output:
	// report done under token 1
	// err: <nil>
	// holders after Do: 0
}
