package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Per-tenant serialisation of three writes (issue 15 part 1): the batch
// form, the same one-round-trip pipeline by hand, and the callback form
// with the same three statements. Each on a pool of its own; paired in
// BenchmarkPaired/op=XactBatch3.

// writeTable creates a table of three counter rows, in a schema of the
// benchmark's own, and returns its qualified name.
func writeTable(b *testing.B, pool *pgxpool.Pool) string {
	b.Helper()
	t := pgx.Identifier{pgtest.Schema(b, pool), "counters"}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+t+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+t+" VALUES (1, 0), (2, 0), (3, 0)"); err != nil {
		b.Fatal(err)
	}
	return t
}

// threeWrites is the statement of the three writes: one per row.
func threeWrites(table string) string { return "UPDATE " + table + " SET n = n + 1 WHERE id = $1" }

// rawXactBatch3 is the physical floor by hand: BEGIN, the lock, three
// writes and COMMIT as one pipeline.
func rawXactBatch3(ctx context.Context, pool *pgxpool.Pool, v int64, write string) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SELECT pg_advisory_xact_lock($1)", v)
	for id := 1; id <= 3; id++ {
		b.Queue(write, id)
	}
	b.Queue("COMMIT")
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' {
			_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		return err
	}
	return nil
}

func (e *benchEnv) xactBatch3(k keys.Key, write string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		b := &pgx.Batch{}
		for id := 1; id <= 3; id++ {
			b.Queue(write, id)
		}
		return e.l.WithXactLockBatch(ctx, []keys.Key{k}, nil, b)
	}
}

func (e *benchEnv) xactCallback3(k keys.Key, write string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		return e.l.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
			for id := 1; id <= 3; id++ {
				if _, err := tx.Exec(ctx, write, id); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

func BenchmarkXactBatch3(b *testing.B) {
	b.Run("impl=raw-pipeline", func(b *testing.B) {
		e := newBenchEnv(b)
		write := threeWrites(writeTable(b, e.pool))
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawXactBatch3(ctx, e.pool, vals[0], write) })
	})
	b.Run("impl=advisory-batch", func(b *testing.B) {
		e := newBenchEnv(b)
		e.run(b, e.xactBatch3(key(b), threeWrites(writeTable(b, e.pool))))
	})
	b.Run("impl=advisory-callback", func(b *testing.B) {
		e := newBenchEnv(b)
		e.run(b, e.xactCallback3(key(b), threeWrites(writeTable(b, e.pool))))
	})
}
