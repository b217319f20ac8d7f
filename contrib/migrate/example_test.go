package pgxlockmigrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	pgxlockmigrate "github.com/pgxlock/pgxlock/contrib/migrate"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// Run golang-migrate's Up under the library's lock, on golang-migrate's own
// lock id: processes on the stock driver and on this one exclude each other.
func ExampleWrap() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()

	// A schema of the example's own (cleaned up below).
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pgxlock_example_migrate_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE")

	db := stdlib.OpenDBFromPool(pool) // the stock pgx/v5 driver runs the migrations
	inner, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{SchemaName: schema})
	if err != nil {
		panic(err)
	}
	d, err := pgxlockmigrate.Wrap(ctx, inner, pool, pgxlockmigrate.Config{SchemaName: schema})
	if err != nil {
		panic(err)
	}
	src, err := iofs.New(fstest.MapFS{
		"1_create.up.sql":   {Data: []byte("CREATE TABLE " + ident + ".t (id int);")},
		"1_create.down.sql": {Data: []byte("DROP TABLE " + ident + ".t;")},
	}, ".")
	if err != nil {
		panic(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", d)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	d.Attach(m) // Migrate's own timer outlasts the lock's bound (10 s)

	fmt.Println(m.Up())
	version, dirty, err := m.Version()
	fmt.Println(version, dirty, err)
	// Output:
	// <nil>
	// 1 false <nil>
}
