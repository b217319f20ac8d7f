package pgtest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ExamplePool returns a pool on the test database for a testable Example
// function, which has no testing.TB, and a function that closes it. It
// discovers the database as DSN does and panics with DSN's message when
// none can be found or the binary does not run Main (a panicking Example
// fails its test binary loudly). Examples must clean up what they create.
func ExamplePool() (*pgxpool.Pool, func()) {
	if !harness.mainRunning.Load() {
		panic("pgtest: call pgtest.Main from TestMain before running Examples")
	}
	harness.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		harness.db, harness.err = discover(ctx, realSources(os.LookupEnv))
	})
	if harness.err != nil {
		panic(harness.err)
	}
	cfg, err := pgxpool.ParseConfig(harness.db.DSN)
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgxlock-example"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	return pool, pool.Close
}
