package advisory_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Two groups of goroutines take the same two keys, one group in the order
// (a, b), the other (b, a). Taken one statement at a time that is the
// textbook deadlock; through the multi-key calls, which sort the keys, it
// never is. Both pools lower deadlock_timeout so that a deadlock, if there
// is one, is found within milliseconds rather than a second.
//
// The goroutines are spread over several Lockers, as over several
// processes: within one Locker, callers waiting for a key queue in process
// and only the first in line waits on the server, so a single Locker would
// test its local queues more than PostgreSQL. Each Locker serves both key
// orders.

const (
	deadlockGroupSize       = 20
	deadlockXactIterations  = 200 // per goroutine
	deadlockSessIterations  = 50  // per goroutine
	deadlockTimeoutSetting  = "20ms"
	deadlockPoolConnections = 20
	deadlockLockers         = 8 // goroutine g uses Locker g / (2*deadlockGroupSize/deadlockLockers)
)

func deadlockPool(t *testing.T) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.MaxConns = deadlockPoolConnections
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = deadlockTimeoutSetting
	return pgtest.NewPool(t, cfg)
}

// oppositeOrders runs 2 x deadlockGroupSize goroutines, iterations calls
// each, even goroutines calling call(g, a, b), odd ones call(g, b, a),
// until they finish or stop is true. It returns the errors, in no order.
func oppositeOrders(a, b keys.Key, iterations int, stop *atomic.Bool, call func(g int, first, second keys.Key) error) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for g := range 2 * deadlockGroupSize {
		first, second := a, b
		if g%2 == 1 {
			first, second = b, a
		}
		wg.Go(func() {
			for range iterations {
				if stop != nil && stop.Load() {
					return
				}
				if err := call(g, first, second); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errs
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, advisory.ErrDeadlock) || (errors.As(err, &pgErr) && pgErr.Code == "40P01")
}

func TestMultiKeyOppositeOrdersNeverDeadlock(t *testing.T) {
	ctx := testCtx(t)
	pool := deadlockPool(t)
	lockers := make([]*advisory.Locker, deadlockLockers)
	for i := range lockers {
		lockers[i] = newLocker(t, pool, advisory.Config{})
	}
	lockerOf := func(g int) *advisory.Locker { return lockers[g/(2*deadlockGroupSize/deadlockLockers)] }
	a, b := key(t), key(t)

	t.Run("WithXactLockAll", func(t *testing.T) {
		var calls atomic.Int64
		errs := oppositeOrders(a, b, deadlockXactIterations, nil, func(g int, first, second keys.Key) error {
			return lockerOf(g).WithXactLockAll(ctx, []keys.Key{first, second}, nil, func(context.Context, pgx.Tx) error {
				calls.Add(1)
				return nil
			})
		})
		assertNoErrors(t, errs)
		assert.EqualValues(t, 2*deadlockGroupSize*deadlockXactIterations, calls.Load())
		t.Logf("WithXactLockAll, %d Lockers: %d calls in opposite key orders, %d errors, %d deadlocks", deadlockLockers, calls.Load(), len(errs), countDeadlocks(errs))
	})

	t.Run("WithLockAll", func(t *testing.T) {
		var calls atomic.Int64
		errs := oppositeOrders(a, b, deadlockSessIterations, nil, func(g int, first, second keys.Key) error {
			return lockerOf(g).WithLockAll(ctx, []keys.Key{first, second}, nil, func(context.Context, *pgx.Conn) error {
				calls.Add(1)
				return nil
			})
		})
		assertNoErrors(t, errs)
		assert.EqualValues(t, 2*deadlockGroupSize*deadlockSessIterations, calls.Load())
		t.Logf("WithLockAll, %d Lockers: %d calls in opposite key orders, %d errors, %d deadlocks", deadlockLockers, calls.Load(), len(errs), countDeadlocks(errs))
	})
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
	pgtest.AssertNoAdvisoryLocks(t, pool)
}

// The control: the same workload with raw pg_advisory_xact_lock statements,
// one key at a time in the caller's order, deadlocks. Without this the
// test above could pass because the workload never contends.
func TestRawSequentialOppositeOrdersDoDeadlock(t *testing.T) {
	ctx := testCtx(t)
	pool := deadlockPool(t)
	a, b := key(t), key(t)
	av, _ := a.Int64()
	bv, _ := b.Int64()
	vals := map[keys.Key]int64{a: av, b: bv}

	var stop atomic.Bool // set at the first deadlock: one is all it takes
	var committed atomic.Int64
	errs := oppositeOrders(a, b, deadlockXactIterations, &stop, func(_ int, first, second keys.Key) error {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", vals[first]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", vals[second])
			return err
		})
		if err == nil {
			committed.Add(1)
		} else if isDeadlock(err) {
			stop.Store(true)
		}
		return err
	})
	deadlocks := countDeadlocks(errs)
	t.Logf("raw sequential pg_advisory_xact_lock in opposite orders: %d committed, %d deadlocks (40P01) before stopping", committed.Load(), deadlocks)
	require.Positive(t, deadlocks, "opposite orders taken one statement at a time must deadlock")
	for _, err := range errs {
		assert.True(t, isDeadlock(err), "only deadlocks expected, got %v", err)
	}
	assert.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

func countDeadlocks(errs []error) int {
	n := 0
	for _, err := range errs {
		if isDeadlock(err) {
			n++
		}
	}
	return n
}

func assertNoErrors(t *testing.T, errs []error) {
	t.Helper()
	if len(errs) == 0 {
		return
	}
	t.Errorf("%d calls failed (%d with 40P01); first: %v", len(errs), countDeadlocks(errs), errs[0])
}
