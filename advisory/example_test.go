package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Keys for the examples: a registered namespace keeps them apart from
// everything else in the database.
var exampleNS = keys.MustRegisterNamespace(0x45584d50, "examples") // "EXMP"

// A migration runner: only one process at a time runs the migrations, on
// the connection that holds the lock.
func ExampleLocker_WithLock() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()

	locker, err := advisory.New(pool, advisory.Config{LockTimeout: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	err = locker.WithLock(ctx, exampleNS.Key(1), nil, func(ctx context.Context, conn *pgx.Conn) error {
		var one int
		// Everything here runs while no other session holds key 1.
		return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	})
	fmt.Println("migrated:", err == nil)
	// Output: migrated: true
}

// A cron replica: every tick, run the job only if no other replica is.
func ExampleLocker_TryWithLock() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{})
	job := exampleNS.Key(2)

	// Another replica is running the job right now.
	other, _ := locker.Lock(ctx, job, nil)

	err := locker.TryWithLock(ctx, job, nil, func(ctx context.Context, _ *pgx.Conn) error {
		fmt.Println("running the job")
		return nil
	})
	if errors.Is(err, advisory.ErrNotAcquired) {
		fmt.Println("skipped: another replica runs it")
	}
	_ = other.Unlock(ctx)
	// Output: skipped: another replica runs it
}

// Per-tenant serialisation inside one transaction: a transfer between two
// tenants takes both keys in one call, so concurrent transfers in opposite
// directions never deadlock.
func ExampleLocker_WithXactLockAll() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{LockTimeout: 5 * time.Second})
	tenants := keys.MustRegisterNamespace(0x54454e54, "tenants") // "TENT"

	from, to := tenants.Key(42), tenants.Key(7)
	err := locker.WithXactLockAll(ctx, []keys.Key{from, to}, nil, func(ctx context.Context, tx pgx.Tx) error {
		// Both tenants are locked until COMMIT; write their rows with tx.
		return nil
	})
	fmt.Println("transferred:", err == nil)
	// Output: transferred: true
}

// A leader that holds its lock for as long as it runs and stops as soon as
// the lock is lost (the connection died, so another replica may lead).
func ExampleLocker_Lock() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{HeartbeatInterval: 5 * time.Second})

	lead, err := locker.TryLock(ctx, exampleNS.Key(3), nil)
	if err != nil {
		fmt.Println("not the leader")
		return
	}
	select {
	case <-lead.Done():
		fmt.Println("leadership lost:", lead.Err())
	case <-time.After(10 * time.Millisecond): // the leader's work
		fmt.Println("led; stepping down")
	}
	fmt.Println("unlock:", lead.Unlock(ctx))
	// Output:
	// led; stepping down
	// unlock: <nil>
}

// Work done elsewhere (another service, another pool) under a session lock:
// the callback's context is cancelled with ErrLockLost if the lock goes.
func ExampleLocker_Hold() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{})

	err := locker.Hold(ctx, keys.Hash("nightly-report"), nil, func(ctx context.Context) error {
		// ... call the report service with ctx ...
		if errors.Is(context.Cause(ctx), advisory.ErrLockLost) {
			return context.Cause(ctx)
		}
		return nil
	})
	fmt.Println("report done:", err == nil)
	// Output: report done: true
}

// Who holds what: the data behind "pgxlock locks".
func ExampleListLocks() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{})
	k := exampleNS.Key(4)

	held, _ := locker.Lock(ctx, k, &advisory.Options{Shared: true})
	infos, _ := advisory.ListLocks(ctx, pool, k)
	for _, li := range infos {
		fmt.Println(li.Key, "shared:", li.Shared, "granted:", li.Granted, "app:", li.ApplicationName)
	}
	_ = held.Unlock(ctx)
	// Output: ns:examples(1163414864)/4 shared: true granted: true app: pgxlock-example
}
