package advisory_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Per-tenant serialisation in one round trip: lock the tenant, write a few
// rows, commit, all sent as one pipeline. Readers attached to the queued
// statements run as the results arrive.
func ExampleLocker_WithXactLockBatch() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	ledger := pgx.Identifier{fmt.Sprintf("example_ledger_%d", os.Getpid())}.Sanitize() // one per test process
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ledger+" (tenant int, amount int)"); err != nil {
		panic(err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP TABLE "+ledger)

	locker, _ := advisory.New(pool, advisory.Config{LockTimeout: 5 * time.Second})
	tenants := keys.MustRegisterNamespace(0x42415443, "batch-tenants") // "BATC"
	tenant := 42

	b := &pgx.Batch{}
	b.Queue("INSERT INTO "+ledger+" VALUES ($1, 100)", tenant)
	b.Queue("INSERT INTO "+ledger+" VALUES ($1, -30)", tenant)
	var balance int
	b.Queue("SELECT sum(amount) FROM "+ledger+" WHERE tenant = $1", tenant).QueryRow(func(row pgx.Row) error {
		return row.Scan(&balance)
	})
	err := locker.WithXactLockBatch(ctx, []keys.Key{tenants.Key(int32(tenant))}, nil, b)
	fmt.Println("committed:", err == nil, "balance:", balance)
	// Output: committed: true balance: 70
}
