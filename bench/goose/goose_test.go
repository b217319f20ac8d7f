package goose

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgxlock/pgxlock/bench/internal/services"
	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/keys"
)

// callers is the number of replicas that run Up at once.
const callers = 8

// migrations returns 5 SQL migrations in schema.
func migrations(schema string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for v := 1; v <= 5; v++ {
		fsys[fmt.Sprintf("%05d_m%d.sql", v, v)] = &fstest.MapFile{Data: fmt.Appendf(nil, `-- +goose Up
CREATE TABLE %[1]s.t%[2]d (id int);
-- +goose Down
DROP TABLE %[1]s.t%[2]d;
`, schema, v)}
	}
	return fsys
}

// race runs Up from `callers` providers at once, each on its own pool,
// with the session locker newLocker gives, and returns the time from the
// start until the last caller returned.
func race(b *testing.B, dsn string, admin *pgxpool.Pool, newLocker func() lock.SessionLocker) time.Duration {
	ctx := context.Background()
	schema := "goose_race_" + strings.ToLower(rand.Text())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		b.Fatal(err)
	}
	defer admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	var ps []*goose.Provider
	for range callers {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		db := stdlib.OpenDBFromPool(pool)
		defer pool.Close()
		defer db.Close()
		p, err := goose.NewProvider(goose.DialectPostgres, db, migrations(schema),
			goose.WithTableName(schema+".goose_db_version"), goose.WithSessionLocker(newLocker()))
		if err != nil {
			b.Fatal(err)
		}
		// The version table exists before the race (goose retries a
		// concurrent creation after 1 s, which would blur the timing).
		if _, err := p.GetDBVersion(ctx); err != nil {
			b.Fatal(err)
		}
		ps = append(ps, p)
	}
	var wg sync.WaitGroup
	errs := make([]error, callers)
	start := time.Now()
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Up(ctx)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			b.Fatalf("caller %d: %v", i, err)
		}
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "goose_db_version"}.Sanitize()+" WHERE version_id > 0").Scan(&n); err != nil || n != 5 {
		b.Fatalf("applied %d migrations (%v), want 5", n, err)
	}
	return took
}

// BenchmarkUpRace: per iteration, one race with each locker on a fresh
// schema and a fresh key. Metrics: s/race for each, and goose/pgxlock.
func BenchmarkUpRace(b *testing.B) {
	ctx := context.Background()
	pg, err := services.StartPostgres(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Stop()
	admin, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	var ours, theirs time.Duration
	b.ResetTimer()
	for i := range b.N {
		var r [8]byte
		_, _ = rand.Read(r[:])
		id := int64(binary.BigEndian.Uint64(r[:]))
		pgx := func() lock.SessionLocker {
			l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(id)})
			if err != nil {
				b.Fatal(err)
			}
			return l
		}
		own := func() lock.SessionLocker {
			l, err := lock.NewPostgresSessionLocker(lock.WithLockID(id), lock.WithLockTimeout(1, 120))
			if err != nil {
				b.Fatal(err)
			}
			return l
		}
		if i%2 == 0 {
			ours += race(b, pg.DSN, admin, pgx)
			theirs += race(b, pg.DSN, admin, own)
		} else {
			theirs += race(b, pg.DSN, admin, own)
			ours += race(b, pg.DSN, admin, pgx)
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ours.Seconds()/float64(b.N), "s/race-pgxlock")
	b.ReportMetric(theirs.Seconds()/float64(b.N), "s/race-goose")
	b.ReportMetric(theirs.Seconds()/ours.Seconds(), "goose/pgxlock")
}
