package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Per-tenant serialisation inside a transaction the caller already has (a
// repository layer, sqlc queries, pgx.BeginTxFunc): the tenant's key is
// held from the lock to the transaction's end. A busy tenant leaves the
// transaction usable, so it can go on without that tenant's work.
func ExampleLocker_LockInTx() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	ledger := pgx.Identifier{fmt.Sprintf("example_intx_ledger_%d", os.Getpid())}.Sanitize() // one per test process
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ledger+" (tenant int, amount int)"); err != nil {
		panic(err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP TABLE "+ledger)

	locker, _ := advisory.New(pool, advisory.Config{LockTimeout: 5 * time.Second})
	tenants := keys.MustRegisterNamespace(0x494e5458, "intx-tenants") // "INTX"

	// Another process works on tenant 7 right now.
	other, _ := locker.Lock(ctx, tenants.Key(7), nil)
	defer other.Unlock(ctx)

	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := locker.LockInTx(ctx, tx, tenants.Key(42), nil); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES (42, 100)"); err != nil {
			return err
		}
		err := locker.TryLockInTx(ctx, tx, tenants.Key(7), nil)
		fmt.Println("tenant 7 busy:", errors.Is(err, advisory.ErrNotAcquired))
		// The transaction is still usable after the busy key.
		_, err = tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES (42, -30)")
		return err
	}) // COMMIT releases tenant 42
	var balance int
	_ = pool.QueryRow(ctx, "SELECT sum(amount) FROM "+ledger).Scan(&balance)
	fmt.Println("committed:", err == nil, "balance:", balance)
	// Output:
	// tenant 7 busy: true
	// committed: true balance: 70
}
