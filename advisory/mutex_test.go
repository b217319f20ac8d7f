package advisory_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// Mutual exclusion: a read-pause-write of a counter row under the lock.
// Without exclusion two critical sections read the same value and one
// increment is lost; an in-process counter of goroutines inside the
// critical section records every overlap as well.
//
// The goroutines share mutexLockers Lockers, each on a pool of its own, as
// several processes would: goroutines of one Locker meet in its local wait
// queue, goroutines of different Lockers only in PostgreSQL.

// criticalSectionPause is part of the workload: it widens the window
// between the read and the write so that an overlap, if the lock allowed
// one, would lose an update. It synchronises nothing.
const criticalSectionPause = 100 * time.Microsecond

const mutexLockers = 4

// mutexLockerSet returns mutexLockers Lockers, each on a pool of its own
// sized for its share of goroutines, and the pools.
func mutexLockerSet(t *testing.T, goroutines int) ([]*advisory.Locker, []*pgxpool.Pool) {
	lockers := make([]*advisory.Locker, mutexLockers)
	pools := make([]*pgxpool.Pool, mutexLockers)
	for i := range lockers {
		cfg := pgtest.Config(t)
		cfg.MaxConns = int32(max(goroutines/mutexLockers, 2))
		pools[i] = pgtest.NewPool(t, cfg)
		lockers[i] = newLocker(t, pools[i], advisory.Config{})
	}
	return lockers, pools
}

func checkPools(t *testing.T, pools []*pgxpool.Pool) {
	t.Helper()
	for _, p := range pools {
		assert.EqualValues(t, 0, p.Stat().AcquiredConns())
		pgtest.AssertNoAdvisoryLocks(t, p)
	}
}

// pause waits criticalSectionPause. It spins (yielding) rather than
// sleeps: time.Sleep rounds 100 µs up to about a millisecond here, which
// would add seconds to 4,800 serialised critical sections.
func pause() {
	end := time.Now().Add(criticalSectionPause)
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}

// section tracks goroutines inside a critical section.
type section struct {
	inside   atomic.Int32
	overlaps atomic.Int32
	maxIn    atomic.Int32
}

func (s *section) enter() {
	n := s.inside.Add(1)
	if n != 1 {
		s.overlaps.Add(1)
	}
	for {
		m := s.maxIn.Load()
		if n <= m || s.maxIn.CompareAndSwap(m, n) {
			return
		}
	}
}

func (s *section) leave() { s.inside.Add(-1) }

// hammer runs goroutines x iterations calls of cs(goroutine) and returns
// the errors.
func hammer(goroutines, iterations int, cs func(g int) error) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for g := range goroutines {
		wg.Go(func() {
			for range iterations {
				if err := cs(g); err != nil {
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

func TestMutualExclusion(t *testing.T) {
	ctx := testCtx(t)
	data := pgtest.Pool(t)
	counter := pgx.Identifier{pgtest.Schema(t, data), "counter"}.Sanitize()
	_, err := data.Exec(ctx, "CREATE TABLE "+counter+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+counter+" VALUES (1, 0)")
	require.NoError(t, err)
	selectN := "SELECT n FROM " + counter + " WHERE id = 1"
	updateN := "UPDATE " + counter + " SET n = $1 WHERE id = 1"
	reset := func() {
		_, err := data.Exec(ctx, "UPDATE "+counter+" SET n = 0 WHERE id = 1")
		require.NoError(t, err)
	}
	final := func() int {
		var n int
		require.NoError(t, data.QueryRow(ctx, selectN).Scan(&n))
		return n
	}

	// The control: the same workload without the lock loses updates, so
	// the assertions below can fail.
	t.Run("control without the lock", func(t *testing.T) {
		const goroutines, iterations = 16, 20
		reset()
		var s section
		errs := hammer(goroutines, iterations, func(int) error {
			s.enter()
			defer s.leave()
			var n int
			if err := data.QueryRow(ctx, selectN).Scan(&n); err != nil {
				return err
			}
			pause()
			_, err := data.Exec(ctx, updateN, n+1)
			return err
		})
		require.Empty(t, errs)
		got := final()
		t.Logf("without the lock: counter %d of %d, overlaps %d", got, goroutines*iterations, s.overlaps.Load())
		assert.Less(t, got, goroutines*iterations, "updates are lost without the lock")
		assert.Positive(t, s.overlaps.Load())
	})

	t.Run("session WithLock, data through another pool", func(t *testing.T) {
		const goroutines, iterations = 16, 300
		reset()
		lockers, pools := mutexLockerSet(t, goroutines)
		k := key(t)
		var s section
		start := time.Now()
		errs := hammer(goroutines, iterations, func(g int) error {
			return lockers[g%mutexLockers].WithLock(ctx, k, nil, func(ctx context.Context, _ *pgx.Conn) error {
				s.enter()
				defer s.leave()
				var n int
				if err := data.QueryRow(ctx, selectN).Scan(&n); err != nil {
					return err
				}
				pause()
				_, err := data.Exec(ctx, updateN, n+1)
				return err
			})
		})
		require.Empty(t, errs)
		assert.Equal(t, goroutines*iterations, final(), "no lost update")
		assert.Zero(t, s.overlaps.Load(), "no two critical sections overlapped")
		t.Logf("%d goroutines on %d Lockers x %d critical sections in %v: counter %d, overlaps %d, most inside at once %d",
			goroutines, mutexLockers, iterations, time.Since(start).Round(time.Millisecond), final(), s.overlaps.Load(), s.maxIn.Load())
		checkPools(t, pools)
	})

	t.Run("WithXactLock, data in the lock's transaction", func(t *testing.T) {
		const goroutines, iterations = 8, 100
		reset()
		lockers, pools := mutexLockerSet(t, goroutines)
		k := key(t)
		var s section
		start := time.Now()
		errs := hammer(goroutines, iterations, func(g int) error {
			return lockers[g%mutexLockers].WithXactLock(ctx, k, nil, func(ctx context.Context, tx pgx.Tx) error {
				s.enter()
				defer s.leave()
				var n int
				if err := tx.QueryRow(ctx, selectN).Scan(&n); err != nil {
					return err
				}
				pause()
				_, err := tx.Exec(ctx, updateN, n+1)
				return err
			})
		})
		require.Empty(t, errs)
		assert.Equal(t, goroutines*iterations, final(), "no lost update")
		assert.Zero(t, s.overlaps.Load(), "no two critical sections overlapped")
		t.Logf("%d goroutines on %d Lockers x %d critical sections in %v: counter %d, overlaps %d, most inside at once %d",
			goroutines, mutexLockers, iterations, time.Since(start).Round(time.Millisecond), final(), s.overlaps.Load(), s.maxIn.Load())
		checkPools(t, pools)
	})
}
