package advisory_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/roundtrip"
	"github.com/pgxlock/pgxlock/keys"
)

// Benchmarks: each helper against raw pgx doing the same SQL by hand, in
// the same run, each on a pool of its own, uncontended. Sub-benchmarks are
// named impl=<name> so that benchstat can put them side by side:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./advisory/ | tee /tmp/advbench.txt
//	benchstat -col /impl /tmp/advbench.txt
//
// Besides ns/op, B/op and allocs/op each reports roundtrips/op, counted on
// the pool's sockets (internal/roundtrip). The raw implementations are what
// careful hand-written code does: a pinned connection, the unlock's result
// checked.
//
// The calls run under a context without a deadline, so that both sides send
// the same lock SQL: given a deadline, the Locker also turns it into a
// server-side lock_timeout (a set_config in the lock statement and a
// context watcher), which raw pgx does not do; impl=advisory-deadline
// measures that.

// benchEnv is one benchmark's pool, its round-trip counter and a Locker.
type benchEnv struct {
	ctx  context.Context
	pool *pgxpool.Pool
	rt   *roundtrip.Counter
	l    *advisory.Locker
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	rt := &roundtrip.Counter{}
	cfg := pgtest.Config(b)
	cfg.ConnConfig.DialFunc = rt.DialFunc
	// No health-check pings: they would be counted as the call's trips.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool := pgtest.NewPool(b, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return &benchEnv{ctx: ctx, pool: pool, rt: rt, l: newLocker(b, pool, advisory.Config{})}
}

// run measures op: a few calls first (statements get prepared), then the
// timed loop, then round trips per call.
func (e *benchEnv) run(b *testing.B, op func(ctx context.Context) error) {
	b.Helper()
	for range 3 {
		if err := op(e.ctx); err != nil {
			b.Fatal(err)
		}
	}
	e.rt.Reset()
	b.ReportAllocs()
	for b.Loop() {
		if err := op(e.ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(e.rt.Count())/float64(b.N), "roundtrips/op")
}

func noopSession(context.Context, *pgx.Conn) error { return nil }
func noopXact(context.Context, pgx.Tx) error       { return nil }

// benchKeys returns n distinct int64 keys for b, sorted (raw code takes
// them in order too), and their values.
func benchKeys(b *testing.B, n int) ([]keys.Key, []int64) {
	vals := make([]int64, n)
	for i := range vals {
		vals[i] = pgtest.UniqueInt64(b)
	}
	slices.Sort(vals)
	ks := make([]keys.Key, n)
	for i, v := range vals {
		ks[i] = keys.Int64(v)
	}
	return ks, vals
}

// rawSessionLock pins a connection, locks the keys one statement each,
// unlocks them in reverse order checking each result, and releases.
func rawSessionLock(ctx context.Context, pool *pgxpool.Pool, vals []int64) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for _, v := range vals {
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", v); err != nil {
			return err
		}
	}
	for i := len(vals) - 1; i >= 0; i-- {
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", vals[i]).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("unlock %d: not held", vals[i])
		}
	}
	return nil
}

// rawSessionLockWork is rawSessionLock of one key with one statement
// between the lock and the unlock.
func rawSessionLockWork(ctx context.Context, pool *pgxpool.Pool, v int64) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", v); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		return err
	}
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", v).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("unlock %d: not held", v)
	}
	return nil
}

// rawXactLock is the naive transaction form: BEGIN, one lock statement per
// key, COMMIT, each a round trip.
func rawXactLock(ctx context.Context, pool *pgxpool.Pool, vals []int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, v := range vals {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", v); err != nil {
				return err
			}
		}
		return nil
	})
}

// rawXactLockPipelined sends BEGIN and the lock in one batch
// (Batch.BeginTx), then COMMIT: what the library does, by hand.
func rawXactLockPipelined(ctx context.Context, pool *pgxpool.Pool, v int64) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("SELECT pg_advisory_xact_lock($1)", v)
	br := c.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

func BenchmarkSessionLock(b *testing.B) {
	b.Run("impl=raw", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawSessionLock(ctx, e.pool, vals) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.WithLock(ctx, k, nil, noopSession) })
	})
	b.Run("impl=advisory-deadline", func(b *testing.B) {
		e := newBenchEnv(b)
		e.ctx = testCtx(b) // a deadline: it becomes the wait's lock_timeout
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.WithLock(ctx, k, nil, noopSession) })
	})
	// Config.LockTimeout: the Locker's bound (a lock_timeout in the lock
	// statement, the wait's bound on the shared timer), under ctx without a
	// deadline.
	b.Run("impl=advisory-locktimeout", func(b *testing.B) {
		e := newBenchEnv(b)
		e.l = newLocker(b, e.pool, advisory.Config{LockTimeout: time.Minute})
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.WithLock(ctx, k, nil, noopSession) })
	})
}

// rawTryLock pins a connection, tries the key, unlocks it checking the
// result, and releases.
func rawTryLock(ctx context.Context, pool *pgxpool.Pool, v int64) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", v).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("try %d: busy", v)
	}
	if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", v).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("unlock %d: not held", v)
	}
	return nil
}

// BenchmarkTryLock is TryWithLock against raw pgx's try and unlock.
func BenchmarkTryLock(b *testing.B) {
	b.Run("impl=raw", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawTryLock(ctx, e.pool, vals[0]) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.TryWithLock(ctx, k, nil, noopSession) })
	})
}

// BenchmarkLockHandle is a Lock+Unlock cycle through a handle (with its
// loss watcher) against raw pgx's lock and unlock on a pinned connection.
func BenchmarkLockHandle(b *testing.B) {
	b.Run("impl=raw", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawSessionLock(ctx, e.pool, vals) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		k := key(b)
		e.run(b, func(ctx context.Context) error { return handleCycle(ctx, e.l, k) })
	})
}

// handleCycle takes k through a handle and unlocks it.
func handleCycle(ctx context.Context, l *advisory.Locker, k keys.Key) error {
	h, err := l.Lock(ctx, k, nil)
	if err != nil {
		return err
	}
	return h.Unlock(ctx)
}

// BenchmarkTryLockHandle is an uncontended TryLock+Unlock through a handle,
// dedicated (Config.DisableMultiplexing) and multiplexed, with round trips
// and allocations per call (issue 22; BenchmarkPaired/op=TryLockHandle
// compares their latencies).
func BenchmarkTryLockHandle(b *testing.B) {
	b.Run("impl=dedicated", func(b *testing.B) {
		e := newBenchEnv(b)
		e.l = newLocker(b, e.pool, advisory.Config{DisableMultiplexing: true})
		k := key(b)
		e.run(b, func(ctx context.Context) error { return tryHandleCycle(ctx, e.l, k) })
	})
	b.Run("impl=multiplexed", func(b *testing.B) {
		e := newBenchEnv(b)
		k := key(b)
		e.run(b, func(ctx context.Context) error { return tryHandleCycle(ctx, e.l, k) })
	})
	b.Run("impl=multiplexed-busy", func(b *testing.B) {
		e := newBenchEnv(b)
		other, err := e.l.TryLock(e.ctx, key(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = other.Unlock(context.Background()) })
		k := key(b)
		e.run(b, func(ctx context.Context) error { return tryHandleCycle(ctx, e.l, k) })
	})
}

// tryHandleCycle takes k through a TryLock handle and unlocks it.
func tryHandleCycle(ctx context.Context, l *advisory.Locker, k keys.Key) error {
	h, err := l.TryLock(ctx, k, nil)
	if err != nil {
		return err
	}
	return h.Unlock(ctx)
}

func BenchmarkXactLock(b *testing.B) {
	b.Run("impl=raw-naive", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawXactLock(ctx, e.pool, vals) })
	})
	b.Run("impl=raw-pipelined", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return rawXactLockPipelined(ctx, e.pool, vals[0]) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.WithXactLock(ctx, k, nil, noopXact) })
	})
	b.Run("impl=advisory-locktimeout", func(b *testing.B) { // as BenchmarkSessionLock's
		e := newBenchEnv(b)
		e.l = newLocker(b, e.pool, advisory.Config{LockTimeout: time.Minute})
		k := key(b)
		e.run(b, func(ctx context.Context) error { return e.l.WithXactLock(ctx, k, nil, noopXact) })
	})
}

func BenchmarkXactLockAll10(b *testing.B) {
	b.Run("impl=raw", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 10)
		e.run(b, func(ctx context.Context) error { return rawXactLock(ctx, e.pool, vals) })
	})
	b.Run("impl=advisory-1key", func(b *testing.B) {
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return e.l.WithXactLockAll(ctx, ks, nil, noopXact) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 10)
		e.run(b, func(ctx context.Context) error { return e.l.WithXactLockAll(ctx, ks, nil, noopXact) })
	})
	b.Run("impl=advisory-timeout", func(b *testing.B) { // the bound is the whole call's: lock_timeout per key
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 10)
		opts := &advisory.Options{Timeout: time.Minute}
		e.run(b, func(ctx context.Context) error { return e.l.WithXactLockAll(ctx, ks, opts, noopXact) })
	})
}

func BenchmarkSessionLockAll10(b *testing.B) {
	b.Run("impl=raw", func(b *testing.B) {
		e := newBenchEnv(b)
		_, vals := benchKeys(b, 10)
		e.run(b, func(ctx context.Context) error { return rawSessionLock(ctx, e.pool, vals) })
	})
	b.Run("impl=advisory-1key", func(b *testing.B) {
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 1)
		e.run(b, func(ctx context.Context) error { return e.l.WithLockAll(ctx, ks, nil, noopSession) })
	})
	b.Run("impl=advisory", func(b *testing.B) {
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 10)
		e.run(b, func(ctx context.Context) error { return e.l.WithLockAll(ctx, ks, nil, noopSession) })
	})
	b.Run("impl=advisory-timeout", func(b *testing.B) { // the bound is the whole call's: lock_timeout per key
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 10)
		opts := &advisory.Options{Timeout: time.Minute}
		e.run(b, func(ctx context.Context) error { return e.l.WithLockAll(ctx, ks, opts, noopSession) })
	})
	// A callback that runs one statement: the unlocks go with the reset.
	b.Run("impl=advisory-sent", func(b *testing.B) {
		e := newBenchEnv(b)
		ks, _ := benchKeys(b, 10)
		e.run(b, func(ctx context.Context) error {
			return e.l.WithLockAll(ctx, ks, nil, func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, "SELECT 1")
				return err
			})
		})
	})
}

// BenchmarkPaired runs the implementations of one operation in turn, one
// call each per iteration (rotating which goes first), each on its own
// pool, and reports each one's median latency and its median ratio to the
// first (raw) implementation. On a machine whose load drifts, interleaving
// keeps the comparison fair where separate benchmarks, seconds apart,
// are not. Allocations here are the sum of all implementations; use the
// benchmarks above for B/op and allocs/op.
func BenchmarkPaired(b *testing.B) {
	type impl struct {
		name string
		op   func(ctx context.Context) error
	}
	paired := func(b *testing.B, impls ...impl) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for _, im := range impls {
			for range 3 {
				if err := im.op(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		lat := make([][]time.Duration, len(impls))
		i := 0
		for b.Loop() {
			for j := range impls {
				n := (i + j) % len(impls)
				t0 := time.Now()
				if err := impls[n].op(ctx); err != nil {
					b.Fatal(err)
				}
				lat[n] = append(lat[n], time.Since(t0))
			}
			i++
		}
		med := make([]float64, len(impls))
		for n, l := range lat {
			slices.Sort(l)
			med[n] = float64(l[len(l)/2].Nanoseconds())
			b.ReportMetric(med[n], impls[n].name+"-p50-ns")
		}
		for n := 1; n < len(impls); n++ {
			b.ReportMetric(med[n]/med[0], impls[n].name+"/"+impls[0].name)
		}
	}
	b.Run("op=WithLock", func(b *testing.B) {
		raw, adv, advDL := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		k, kDL := key(b), key(b)
		dl := testCtx(b)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawSessionLock(ctx, raw.pool, vals) }},
			impl{"advisory", func(ctx context.Context) error { return adv.l.WithLock(ctx, k, nil, noopSession) }},
			impl{"advisory-deadline", func(context.Context) error { return advDL.l.WithLock(dl, kDL, nil, noopSession) }})
	})
	// A callback that runs one statement on its connection: the library's
	// call then ends with the unlock and the reset (the callback sent
	// something), raw pgx's with the unlock alone.
	b.Run("op=WithLockOneStatement", func(b *testing.B) {
		raw, adv := newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		k := key(b)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawSessionLockWork(ctx, raw.pool, vals[0]) }},
			impl{"advisory", func(ctx context.Context) error {
				return adv.l.WithLock(ctx, k, nil, func(ctx context.Context, c *pgx.Conn) error {
					_, err := c.Exec(ctx, "SELECT 1")
					return err
				})
			}})
	})
	b.Run("op=TryWithLock", func(b *testing.B) {
		raw, adv := newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		k := key(b)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawTryLock(ctx, raw.pool, vals[0]) }},
			impl{"advisory", func(ctx context.Context) error { return adv.l.TryWithLock(ctx, k, nil, noopSession) }})
	})
	b.Run("op=LockHandle", func(b *testing.B) {
		raw, h, adv := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		kh, k := key(b), key(b)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawSessionLock(ctx, raw.pool, vals) }},
			impl{"handle", func(ctx context.Context) error { return handleCycle(ctx, h.l, kh) }},
			impl{"withlock", func(ctx context.Context) error { return adv.l.WithLock(ctx, k, nil, noopSession) }})
	})
	// Issue 22: an uncontended TryLock+Unlock through a handle, dedicated
	// (Config.DisableMultiplexing) against multiplexed (a holder connection
	// that holds only this lock, so it goes back to the pool at each unlock)
	// and multiplexed on a busy holder (another lock stays held on it, so
	// every call runs on the shared connection, whose watcher's read it cuts
	// short). The target: multiplexed/dedicated <= 1.05.
	b.Run("op=TryLockHandle", func(b *testing.B) {
		ded, mux, busy := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		ded.l = newLocker(b, ded.pool, advisory.Config{DisableMultiplexing: true})
		kd, km, kb := key(b), key(b), key(b)
		other, err := busy.l.TryLock(busy.ctx, key(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = other.Unlock(context.Background()) })
		paired(b,
			impl{"dedicated", func(ctx context.Context) error { return tryHandleCycle(ctx, ded.l, kd) }},
			impl{"multiplexed", func(ctx context.Context) error { return tryHandleCycle(ctx, mux.l, km) }},
			impl{"multiplexed-busy", func(ctx context.Context) error { return tryHandleCycle(ctx, busy.l, kb) }})
	})
	b.Run("op=WithXactLock", func(b *testing.B) {
		naive, piped, adv := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 1)
		k := key(b)
		paired(b,
			impl{"raw-naive", func(ctx context.Context) error { return rawXactLock(ctx, naive.pool, vals) }},
			impl{"raw-pipelined", func(ctx context.Context) error { return rawXactLockPipelined(ctx, piped.pool, vals[0]) }},
			impl{"advisory", func(ctx context.Context) error { return adv.l.WithXactLock(ctx, k, nil, noopXact) }})
	})
	b.Run("op=WithXactLockAll10", func(b *testing.B) {
		raw, one, adv := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 10)
		ks, _ := benchKeys(b, 10)
		k1, _ := benchKeys(b, 1)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawXactLock(ctx, raw.pool, vals) }},
			impl{"advisory-1key", func(ctx context.Context) error { return one.l.WithXactLockAll(ctx, k1, nil, noopXact) }},
			impl{"advisory", func(ctx context.Context) error { return adv.l.WithXactLockAll(ctx, ks, nil, noopXact) }})
	})
	b.Run("op=WithLockAll10", func(b *testing.B) {
		raw, one, adv := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		_, vals := benchKeys(b, 10)
		ks, _ := benchKeys(b, 10)
		k1, _ := benchKeys(b, 1)
		paired(b,
			impl{"raw", func(ctx context.Context) error { return rawSessionLock(ctx, raw.pool, vals) }},
			impl{"advisory-1key", func(ctx context.Context) error { return one.l.WithLockAll(ctx, k1, nil, noopSession) }},
			impl{"advisory", func(ctx context.Context) error { return adv.l.WithLockAll(ctx, ks, nil, noopSession) }})
	})
	b.Run("op=XactBatch3", func(b *testing.B) { // see bench_batch_test.go
		raw, batch, callback := newBenchEnv(b), newBenchEnv(b), newBenchEnv(b)
		write := threeWrites(writeTable(b, raw.pool))
		_, vals := benchKeys(b, 1)
		paired(b,
			impl{"raw-pipeline", func(ctx context.Context) error { return rawXactBatch3(ctx, raw.pool, vals[0], write) }},
			impl{"advisory-batch", batch.xactBatch3(key(b), write)},
			impl{"advisory-callback", callback.xactCallback3(key(b), write)})
	})
}
