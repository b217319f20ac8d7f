package suite

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Per-tenant serialisation of three writes (issue 15 part 1): lock the
// tenant, update three rows, commit. The batch form sends it all as one
// pipeline; the same pipeline by hand is its baseline; the callback form
// with the same three statements costs 2 + 3 round trips. The rows live in
// the bench schema's tenant_rows table, made by the first instance. An
// Op's fn runs in the reader of the last write: after the server has run
// the whole pipeline (the batch forms cannot run client code under the
// lock), while holding in the callback form.

func batchRowsTable(e *Env) string { return pgx.Identifier{e.Schema, "tenant_rows"}.Sanitize() }

// batchWrite is each of the three writes: row id $1 of batchRowsTable.
func batchWrite(e *Env) string { return "UPDATE " + batchRowsTable(e) + " SET n = n + 1 WHERE id = $1" }

func prepareBatchRows(ctx context.Context, e *Env, pool *pgxpool.Pool) error {
	for _, s := range []string{
		"CREATE TABLE IF NOT EXISTS " + batchRowsTable(e) + " (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)",
		"INSERT INTO " + batchRowsTable(e) + " (id) VALUES (1), (2), (3) ON CONFLICT DO NOTHING",
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// queueWrites adds the three writes to b, fn in the last one's reader.
func queueWrites(b *pgx.Batch, write string, fn func()) {
	for id := 1; id <= 3; id++ {
		q := b.Queue(write, id)
		if id == 3 && fn != nil {
			q.Exec(func(pgconn.CommandTag) error { fn(); return nil })
		}
	}
}

// batchLocker is newLocker plus the rows.
func batchLocker(ctx context.Context, e *Env, s Spec) (*advisory.Locker, func(), error) {
	l, closeFn, err := newLocker(ctx, e, s, advisory.Config{})
	if err == nil {
		if err = prepareBatchRows(ctx, e, l.Pool()); err != nil {
			closeFn()
		}
	}
	return l, closeFn, err
}

var (
	pgxlockXactBatch3 = Contender{Name: "pgxlock WithXactLockBatch (3 writes)", Impl: "pgxlock",
		Note: "one pipeline: BEGIN, lock, 3 writes, COMMIT, reset",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := batchLocker(ctx, e, s)
			if err != nil {
				return nil, err
			}
			write := batchWrite(e)
			return lockerWorkers(closeFn, func(kb *keyBuf) Op {
				return func(ctx context.Context, ks []int64, fn func()) error {
					b := &pgx.Batch{}
					queueWrites(b, write, fn)
					return l.WithXactLockBatch(ctx, kb.keys(ks[:1]), nil, b)
				}
			}), nil
		}}

	rawXactBatch3 = Contender{Name: "raw pgx [BEGIN+lock+3 writes+COMMIT]", Impl: "raw pgx",
		Note: "one pipeline by hand", New: rawBatch3(false)}

	rawXactBatch3Reset = Contender{Name: "raw pgx [BEGIN+lock+3 writes+COMMIT+reset]", Impl: "raw pgx",
		Note: "the same, plus the library's session reset (identity, unlock_all, cursors, LISTEN, RESET ALL, temp tables)", New: rawBatch3(true)}

	pgxlockWithXactLock3 = Contender{Name: "pgxlock WithXactLock (3 writes)", Impl: "pgxlock",
		Note: "callback: 2 + 3 round trips",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := batchLocker(ctx, e, s)
			if err != nil {
				return nil, err
			}
			write := batchWrite(e)
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				return l.WithXactLock(ctx, keys.Int64(ks[0]), nil, func(ctx context.Context, tx pgx.Tx) error {
					for id := 1; id <= 3; id++ {
						if _, err := tx.Exec(ctx, write, id); err != nil {
							return err
						}
					}
					call(fn)
					return nil
				})
			}, closeFn), nil
		}}
)

// rawBatch3 is the one-pipeline form by hand, with or without the session
// reset that the library sends after COMMIT.
// resetStatements mirror the library's reset (pooltx's ResetSQL) one by
// one, as its batch form queues them.
var resetStatements = []string{"RESET SESSION AUTHORIZATION", "RESET ROLE", "SELECT pg_catalog.pg_advisory_unlock_all()",
	"CLOSE ALL", "UNLISTEN *", "RESET ALL", "DISCARD TEMP", "DISCARD SEQUENCES"}

func rawBatch3(reset bool) func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
	return func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
		pool, closeFn, err := newPool(ctx, e, s)
		if err != nil {
			return nil, err
		}
		if err := prepareBatchRows(ctx, e, pool); err != nil {
			closeFn()
			return nil, err
		}
		write := batchWrite(e)
		return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer c.Release()
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			b.Queue(sqlXactLock, ks[0])
			queueWrites(b, write, fn)
			b.Queue("COMMIT")
			if reset {
				// pooltx's reset, statement for statement (its probe
				// form executes a prepared unlock_all instead).
				for _, sql := range resetStatements {
					b.Queue(sql)
				}
			}
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				if c.Conn().PgConn().TxStatus() != 'I' {
					_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
				}
				return err
			}
			return nil
		}, closeFn), nil
	}
}
