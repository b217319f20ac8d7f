package pooltx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/pooltx"
)

// Benchmarks of the helpers' own cost: one trivial statement in the
// callback, uncontended, on a pool of one connection, with round trips per
// call counted on the pool's socket. Compare runs with benchstat:
//
//	go test -run '^$' -bench . -benchmem -benchtime=2000x -count 6 ./pooltx/

// countedPool is a pool of one connection whose round trips are counted,
// without health-check pings (they would be counted as the call's trips).
func countedPool(b testing.TB) (*pgxpool.Pool, *roundtrip.Counter) {
	b.Helper()
	rt := &roundtrip.Counter{}
	cfg := pgtest.Config(b)
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = rt.DialFunc
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	return pgtest.NewPool(b, cfg), rt
}

func benchRun(b *testing.B, rt *roundtrip.Counter, op func(ctx context.Context) error) {
	ctx := context.Background()
	for range 3 { // prepare the statements
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
	}
	rt.Reset()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.Count())/float64(b.N), "roundtrips/op")
}

func BenchmarkWithConn(b *testing.B) {
	pool, rt := countedPool(b)
	benchRun(b, rt, func(ctx context.Context) error {
		return pooltx.WithConn(ctx, pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
			_, err := c.Conn().Exec(ctx, "SELECT $1::int", 1)
			return err
		})
	})
}

func BenchmarkWithTx(b *testing.B) {
	pool, rt := countedPool(b)
	benchRun(b, rt, func(ctx context.Context) error {
		return pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT $1::int", 1)
			return err
		})
	})
}

func BenchmarkWithTxRollback(b *testing.B) {
	pool, rt := countedPool(b)
	benchRun(b, rt, func(ctx context.Context) error {
		err := pooltx.WithTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT $1::int", 1)
			if err != nil {
				return err
			}
			return errRollback
		})
		if err == errRollback {
			return nil
		}
		return err
	})
}

var errRollback = &rollbackErr{}

type rollbackErr struct{}

func (*rollbackErr) Error() string { return "rollback" }
