package suite

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
)

// The contenders built on PostgreSQL through pgx: the library's helpers and
// the same SQL written by hand with pgx, which is what the library must not
// cost more than.

// leaseTTL is the TTL of every lease-like contender (also Redis and goose
// table locks): long enough never to expire during a run.
const leaseTTL = 30 * time.Second

// newLocker builds an advisory.Locker on its own pool (or the shared one).
func newLocker(ctx context.Context, e *Env, s Spec, cfg advisory.Config) (*advisory.Locker, func(), error) {
	pool, closePool, err := newPool(ctx, e, s)
	if err != nil {
		return nil, nil, err
	}
	l, err := advisory.New(pool, cfg)
	if err != nil {
		closePool()
		return nil, nil, err
	}
	return l, closePool, nil
}

// keyBuf converts int64 keys to keys.Key without allocating per call (one
// buffer per worker goroutine).
type keyBuf struct{ b []keys.Key }

func (kb *keyBuf) keys(ks []int64) []keys.Key {
	kb.b = kb.b[:0]
	for _, k := range ks {
		kb.b = append(kb.b, keys.Int64(k))
	}
	return kb.b
}

// lockerWorkers gives each worker its own key buffer around a Locker call.
func lockerWorkers(closeFn func(), mk func(kb *keyBuf) Op) *Instance {
	return &Instance{
		Worker: func(int) (Op, error) { return mk(&keyBuf{}), nil },
		Close:  closeFn,
	}
}

var (
	pgxlockWithLock = Contender{Name: "pgxlock WithLock", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, advisory.Config{})
			if err != nil {
				return nil, err
			}
			return lockerWorkers(closeFn, func(kb *keyBuf) Op {
				return func(ctx context.Context, ks []int64, fn func()) error {
					return l.WithLock(ctx, keys.Int64(ks[0]), nil, func(context.Context, *pgx.Conn) error {
						call(fn)
						return nil
					})
				}
			}), nil
		}}

	pgxlockTryWithLock = Contender{Name: "pgxlock TryWithLock", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, advisory.Config{})
			if err != nil {
				return nil, err
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				err := l.TryWithLock(ctx, keys.Int64(ks[0]), nil, func(context.Context, *pgx.Conn) error {
					call(fn)
					return nil
				})
				if errors.Is(err, advisory.ErrNotAcquired) {
					return errBusy
				}
				return err
			}, closeFn), nil
		}}

	pgxlockLockHandle = Contender{Name: "pgxlock Lock+Unlock (handle)", Impl: "pgxlock",
		Note: "handle with a watcher goroutine; for holders that outlive a call",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, advisory.Config{})
			if err != nil {
				return nil, err
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				h, err := l.Lock(ctx, keys.Int64(ks[0]), nil)
				if err != nil {
					return err
				}
				call(fn)
				return h.Unlock(ctx)
			}, closeFn), nil
		}}

	pgxlockWithLockAll = withLockAllContender(advisory.Config{})

	pgxlockWithXactLock = Contender{Name: "pgxlock WithXactLock", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, advisory.Config{})
			if err != nil {
				return nil, err
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				return l.WithXactLock(ctx, keys.Int64(ks[0]), nil, func(context.Context, pgx.Tx) error {
					call(fn)
					return nil
				})
			}, closeFn), nil
		}}

	pgxlockWithXactLockAll = withXactLockAllContender(advisory.Config{})
)

// Raw pgx: the SQL a careful user would write by hand on a pinned pooled
// connection, checking the unlock result.
const (
	sqlLock       = "SELECT pg_advisory_lock($1)"
	sqlTryLock    = "SELECT pg_try_advisory_lock($1)"
	sqlUnlock     = "SELECT pg_advisory_unlock($1)"
	sqlXactLock   = "SELECT pg_advisory_xact_lock($1)"
	sqlLockMany   = "SELECT pg_advisory_lock(k) FROM unnest($1::int8[]) WITH ORDINALITY AS u(k, n) ORDER BY n"
	sqlUnlockMany = "SELECT pg_advisory_unlock(k) FROM unnest($1::int8[]) WITH ORDINALITY AS u(k, n) ORDER BY n DESC"
	sqlXactMany   = "SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) WITH ORDINALITY AS u(k, n) ORDER BY n"
)

var errNotHeld = errors.New("bench: unlock returned false")

func rawUnlock(ctx context.Context, c *pgxpool.Conn, k int64) error {
	var ok bool
	if err := c.QueryRow(ctx, sqlUnlock, k).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errNotHeld
	}
	return nil
}

// sortedKeys sorts and de-duplicates into a per-worker buffer, as a careful
// hand-written multi-key lock must (to avoid deadlocks between callers).
type sortBuf struct{ b []int64 }

func (sb *sortBuf) sorted(ks []int64) []int64 {
	sb.b = append(sb.b[:0], ks...)
	slices.Sort(sb.b)
	return slices.Compact(sb.b)
}

func rawInstance(ctx context.Context, e *Env, s Spec, mk func(pool *pgxpool.Pool) func() Op) (*Instance, error) {
	pool, closeFn, err := newPool(ctx, e, s)
	if err != nil {
		return nil, err
	}
	worker := mk(pool)
	return &Instance{Worker: func(int) (Op, error) { return worker(), nil }, Close: closeFn}, nil
}

var (
	rawLockUnlock = Contender{Name: "raw pgx lock/unlock", Impl: "raw pgx",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						c, err := pool.Acquire(ctx)
						if err != nil {
							return err
						}
						defer c.Release()
						if _, err := c.Exec(ctx, sqlLock, ks[0]); err != nil {
							return err
						}
						call(fn)
						return rawUnlock(ctx, c, ks[0])
					}
				}
			})
		}}

	// The A/A controls: the baseline's own code on a pool of its own, timed
	// in the same interleaved slices. Its ratio to the baseline is what
	// this machine's noise alone gives a ratio (BENCHMARKS.md, "the noise
	// floor"): a target closer to 1 than that spread cannot be judged by
	// one run.
	rawLockUnlockAA = aaControl(rawLockUnlock)

	rawTryUnlock = Contender{Name: "raw pgx try/unlock", Impl: "raw pgx",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						c, err := pool.Acquire(ctx)
						if err != nil {
							return err
						}
						defer c.Release()
						var ok bool
						if err := c.QueryRow(ctx, sqlTryLock, ks[0]).Scan(&ok); err != nil {
							return err
						}
						if !ok {
							return errBusy
						}
						call(fn)
						return rawUnlock(ctx, c, ks[0])
					}
				}
			})
		}}

	rawLockMany = Contender{Name: "raw pgx lock/unlock (unnest)", Impl: "raw pgx",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					sb := &sortBuf{}
					return func(ctx context.Context, ks []int64, fn func()) error {
						ks = sb.sorted(ks)
						c, err := pool.Acquire(ctx)
						if err != nil {
							return err
						}
						defer c.Release()
						if _, err := c.Exec(ctx, sqlLockMany, ks); err != nil {
							return err
						}
						call(fn)
						rows, err := c.Query(ctx, sqlUnlockMany, ks)
						if err != nil {
							return err
						}
						falses := 0
						for rows.Next() {
							var ok bool
							if err := rows.Scan(&ok); err != nil {
								rows.Close()
								return err
							}
							if !ok {
								falses++
							}
						}
						if err := rows.Err(); err != nil {
							return err
						}
						if falses > 0 {
							return errNotHeld
						}
						return nil
					}
				}
			})
		}}

	rawXactNaive = Contender{Name: "raw pgx BEGIN; lock; COMMIT (naive)", Impl: "raw pgx",
		Note: "3 round trips",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							if _, err := tx.Exec(ctx, sqlXactLock, ks[0]); err != nil {
								return err
							}
							call(fn)
							return nil
						})
					}
				}
			})
		}}

	rawXactPipelinedAA = aaControl(rawXactPipelined)

	rawXactPipelined = Contender{Name: "raw pgx [BEGIN+lock]; COMMIT (pipelined)", Impl: "raw pgx",
		Note: "Batch.BeginTx: 2 round trips",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						return rawPipelinedXact(ctx, pool, sqlXactLock, ks[0], fn)
					}
				}
			})
		}}

	rawXactPipelinedMany = Contender{Name: "raw pgx [BEGIN+lock (unnest)]; COMMIT", Impl: "raw pgx",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					sb := &sortBuf{}
					return func(ctx context.Context, ks []int64, fn func()) error {
						return rawPipelinedXact(ctx, pool, sqlXactMany, sb.sorted(ks), fn)
					}
				}
			})
		}}
)

func rawPipelinedXact(ctx context.Context, pool *pgxpool.Pool, sql string, arg any, fn func()) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sql, arg)
	br := c.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	call(fn)
	return tx.Commit(ctx)
}

// Leases. The column lease works on rows 1..leaseRows of leaseJobsTable; the
// lock-manager lease on the library's tables in the bench schema.
const leaseRows = 1000

func jobsTable(e *Env) string { return pgx.Identifier{e.Schema, "jobs"}.Sanitize() }

// prepareLeases creates the bench schema's lease tables.
func prepareLeases(ctx context.Context, e *Env, pool *pgxpool.Pool) error {
	stmts := []string{
		"DROP SCHEMA IF EXISTS " + pgx.Identifier{e.Schema}.Sanitize() + " CASCADE",
		"CREATE SCHEMA " + pgx.Identifier{e.Schema}.Sanitize(),
		"CREATE TABLE " + jobsTable(e) + " (id bigint PRIMARY KEY, locked_at timestamptz, locked_by text, lock_fence bigint NOT NULL DEFAULT 0)",
		fmt.Sprintf("INSERT INTO %s (id) SELECT g FROM generate_series(1, %d) g", jobsTable(e), leaseRows),
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: e.Schema, TTL: leaseTTL})
	if err != nil {
		return err
	}
	return m.Migrate(ctx)
}

// newUUID is a random version-4 UUID, as the library's owner tokens.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

var (
	pgxlockColumnLease = Contender{Name: "pgxlock lease.Column TryAcquire+Release", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			pool, closeFn, err := newPool(ctx, e, s)
			if err != nil {
				return nil, err
			}
			col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: e.Schema, Table: "jobs", TTL: leaseTTL})
			if err != nil {
				closeFn()
				return nil, err
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				l, err := col.TryAcquire(ctx, ks[0])
				if errors.Is(err, lease.ErrNotAcquired) {
					return errBusy
				}
				if err != nil {
					return err
				}
				call(fn)
				return l.Release(ctx)
			}, closeFn), nil
		}}

	rawColumnLease = Contender{Name: "raw pgx column UPDATE/UPDATE", Impl: "raw pgx",
		Note: "same two statements by hand",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			r := strings.NewReplacer("{t}", jobsTable(e), "{id}", `"id"`, "{at}", `"locked_at"`,
				"{by}", `"locked_by"`, "{fence}", `"lock_fence"`)
			acquire, release := r.Replace(rawColumnAcquireSQL), r.Replace(rawColumnReleaseSQL)
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						owner := newUUID()
						var token *int64
						var exists bool
						if err := pool.QueryRow(ctx, acquire, ks[0], owner, leaseTTL).Scan(&token, &exists); err != nil {
							return err
						}
						if token == nil {
							return errBusy
						}
						call(fn)
						var ours bool
						if err := pool.QueryRow(ctx, release, ks[0], owner).Scan(&ours, &exists); err != nil {
							return err
						}
						if !ours {
							return errNotHeld
						}
						return nil
					}
				}
			})
		}}

	pgxlockManagerLease = Contender{Name: "pgxlock lease.Manager TryAcquire+Release", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			pool, closeFn, err := newPool(ctx, e, s)
			if err != nil {
				return nil, err
			}
			m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: e.Schema, TTL: leaseTTL, Owner: "pgxlockbench"})
			if err != nil {
				closeFn()
				return nil, err
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				l, err := m.TryAcquire(ctx, resourceName(ks[0]), nil)
				if errors.Is(err, lease.ErrNotAcquired) {
					return errBusy
				}
				if err != nil {
					return err
				}
				call(fn)
				return l.Release(ctx)
			}, closeFn), nil
		}}

	rawManagerLease = Contender{Name: "raw pgx lock-manager SQL by hand", Impl: "raw pgx",
		Note: "same batch and release statement",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			r := strings.NewReplacer(
				"{holders}", pgx.Identifier{e.Schema, lease.DefaultTable}.Sanitize(),
				"{resources}", pgx.Identifier{e.Schema, lease.DefaultTable + "_resources"}.Sanitize())
			lockRes, acquire, release := r.Replace(rawLockResourceSQL), r.Replace(rawAcquireSQL), r.Replace(rawReleaseSQL)
			const channel = "pgxlockbench_raw"
			return rawInstance(ctx, e, s, func(pool *pgxpool.Pool) func() Op {
				return func() Op {
					return func(ctx context.Context, ks []int64, fn func()) error {
						res, id := resourceName(ks[0]), newUUID()
						var (
							token              *int64
							acquiredAt, expiry *time.Time
							retryAfter         *float64
						)
						b := &pgx.Batch{}
						b.Queue(lockRes, res)
						b.Queue(acquire, res, "exclusive", id, "pgxlockbench", leaseTTL, nil, nil, 3*time.Second).
							QueryRow(func(row pgx.Row) error { return row.Scan(&token, &acquiredAt, &expiry, &retryAfter) })
						if err := pool.SendBatch(ctx, b).Close(); err != nil {
							return err
						}
						if token == nil {
							return errBusy
						}
						call(fn)
						var n int64
						if err := pool.QueryRow(ctx, release, res, *token, id, channel).Scan(&n); err != nil {
							return err
						}
						if n == 0 {
							return errNotHeld
						}
						return nil
					}
				}
			})
		}}
)

func resourceName(k int64) string { return fmt.Sprintf("bench/%d", k) }

// withLockAllContender is WithLockAll on one Locker with cfg, taking every
// key the workload passes in one call.
func withLockAllContender(cfg advisory.Config) Contender {
	return Contender{Name: "pgxlock WithLockAll", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, cfg)
			if err != nil {
				return nil, err
			}
			return lockerWorkers(closeFn, func(kb *keyBuf) Op {
				return func(ctx context.Context, ks []int64, fn func()) error {
					return l.WithLockAll(ctx, kb.keys(ks), nil, func(context.Context, *pgx.Conn) error {
						call(fn)
						return nil
					})
				}
			}), nil
		}}
}

// withXactLockAllContender is withLockAllContender in transaction scope.
func withXactLockAllContender(cfg advisory.Config) Contender {
	return Contender{Name: "pgxlock WithXactLockAll", Impl: "pgxlock",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			l, closeFn, err := newLocker(ctx, e, s, cfg)
			if err != nil {
				return nil, err
			}
			return lockerWorkers(closeFn, func(kb *keyBuf) Op {
				return func(ctx context.Context, ks []int64, fn func()) error {
					return l.WithXactLockAll(ctx, kb.keys(ks), nil, func(context.Context, pgx.Tx) error {
						call(fn)
						return nil
					})
				}
			}), nil
		}}
}

// aaControl is c again under another name: the same code, measured as one
// more row of its group (see rawLockUnlockAA).
func aaControl(c Contender) Contender {
	c.Name += " (A/A: same code, own pool)"
	c.Note = "A/A control: the baseline's code again"
	return c
}
