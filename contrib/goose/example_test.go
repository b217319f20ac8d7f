package pgxlockgoose_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// Run goose's migrations under a blocking advisory lock on goose's own key:
// processes on goose's NewPostgresSessionLocker and on this one exclude
// each other.
func ExampleNewSessionLocker() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool) // goose needs the pgx stdlib driver
	defer db.Close()

	// A schema of the example's own (cleaned up below).
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pgxlock_example_goose_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE")

	locker, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{}) // goose's key, 5 min lock_timeout
	if err != nil {
		panic(err)
	}
	migrations := fstest.MapFS{
		"00001_create.sql": {Data: []byte("-- +goose Up\nCREATE TABLE " + ident + ".t (id int);\n-- +goose Down\nDROP TABLE " + ident + ".t;\n")},
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
		goose.WithSessionLocker(locker), goose.WithTableName(schema+".goose_db_version"))
	if err != nil {
		panic(err)
	}
	results, err := provider.Up(ctx)
	fmt.Println(len(results), "applied;", err)
	// Output: 1 applied; <nil>
}
