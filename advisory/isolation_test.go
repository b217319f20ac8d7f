package advisory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The package doc's "Isolation": under REPEATABLE READ a transaction-level
// lock's snapshot is taken before it waits, so a transaction that waited
// for the previous holder reads the data from before that holder's commit;
// READ COMMITTED (Options.TxOptions over a stricter session default), or a
// session-level lock with the stricter transaction begun inside, reads it
// after. Two Lockers on two pools: two processes (one Locker would queue
// the second call locally, before anything is sent).
func TestIsolationXactLockSnapshotPredatesTheWait(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t, admin)
	table := pgx.Identifier{schema, "counter"}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE TABLE "+table+" (n int); INSERT INTO "+table+" VALUES (0)")
	require.NoError(t, err)
	rrPool := func() *advisory.Locker {
		cfg := pgtest.Config(t)
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		return newLocker(t, pgtest.NewPool(t, cfg), advisory.Config{})
	}
	holder, waiter := rrPool(), rrPool()
	read := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int, error) {
		var n int
		err := q.QueryRow(ctx, "SELECT n FROM "+table).Scan(&n)
		return n, err
	}
	rc := &advisory.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.ReadCommitted}}
	for _, c := range []struct {
		name  string
		fresh bool
		wait  func(k keys.Key) (int, error)
	}{
		{"WithXactLock, session default repeatable read", false, func(k keys.Key) (n int, err error) {
			return n, waiter.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error { n, err = read(ctx, tx); return err })
		}},
		{"WithXactLock, TxOptions read committed", true, func(k keys.Key) (n int, err error) {
			return n, waiter.WithXactLock(ctx, k, rc, func(ctx context.Context, tx pgx.Tx) error { n, err = read(ctx, tx); return err })
		}},
		{"WithLock, then a repeatable read transaction", true, func(k keys.Key) (n int, err error) {
			return n, waiter.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error {
				return pgx.BeginTxFunc(ctx, c, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error { n, err = read(ctx, tx); return err })
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := key(t)
			inFn, release := make(chan struct{}), make(chan struct{})
			held := make(chan error, 1)
			go func() {
				held <- holder.WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "UPDATE "+table+" SET n = n + 1"); err != nil {
						return err
					}
					close(inFn)
					<-release
					return nil
				})
			}()
			<-inFn
			type result struct {
				n   int
				err error
			}
			got := make(chan result, 1)
			go func() { n, err := c.wait(k); got <- result{n, err} }()
			awaitWaiting(ctx, t, admin, k, 1) // its snapshot, if it has one, is taken
			close(release)
			require.NoError(t, <-held)
			r := <-got
			require.NoError(t, r.err)
			now, err := read(ctx, admin)
			require.NoError(t, err)
			if c.fresh {
				assert.Equal(t, now, r.n, "read after the holder's commit")
			} else {
				assert.Equal(t, now-1, r.n, "read from before the holder's commit, as the doc says")
			}
		})
	}
}
