package suite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	goose "github.com/pressly/goose/v3/lock"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
)

// The peers. Each is used as its documentation shows, with the knobs that
// matter for a benchmark set explicitly:
//   - polling peers (goose table locker, redislock, redsync) retry every
//     Env.Poll; goose's session locker cannot poll faster than once a
//     second (its option takes whole seconds), so it polls at 1 s;
//   - lease-style peers get leaseTTL (30 s), so nothing expires in a run;
//   - per-goroutine state stands for separate processes: an etcd session
//     per goroutine (one session's mutexes on one prefix share a key), a
//     goose table locker per goroutine and key (its Lock holds a process
//     mutex until Unlock), a redsync Mutex per goroutine and key.

// openSQLDB opens a database/sql pool through pgx's stdlib driver, counted.
func openSQLDB(e *Env, s Spec) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(e.DSN)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "pgxlockbench"
	if s.Counter != nil {
		cfg.DialFunc = s.Counter.DialFunc
	}
	db := stdlib.OpenDB(*cfg)
	size := s.PoolSize
	if size <= 0 {
		size = 4
	}
	db.SetMaxOpenConns(size)
	db.SetMaxIdleConns(size)
	return db, nil
}

var (
	gooseSession = Contender{Name: "goose lock.SessionLocker", Impl: "goose session", Peer: true,
		Note: "pg_try_advisory_lock polled every 1 s (its minimum)",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			db, err := openSQLDB(e, s)
			if err != nil {
				return nil, err
			}
			var mu sync.Mutex
			lockers := map[int64]goose.SessionLocker{}
			locker := func(k int64) (goose.SessionLocker, error) {
				mu.Lock()
				defer mu.Unlock()
				if l, ok := lockers[k]; ok {
					return l, nil
				}
				l, err := goose.NewPostgresSessionLocker(goose.WithLockID(k), goose.WithLockTimeout(1, math.MaxInt32))
				if err != nil {
					return nil, err
				}
				lockers[k] = l
				return l, nil
			}
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				l, err := locker(ks[0])
				if err != nil {
					return err
				}
				conn, err := db.Conn(ctx)
				if err != nil {
					return err
				}
				defer conn.Close()
				if err := l.SessionLock(ctx, conn); err != nil {
					return err
				}
				call(fn)
				return l.SessionUnlock(ctx, conn)
			}, func() { db.Close() }), nil
		}}

	gooseTable = Contender{Name: "goose lock.Locker (table)", Impl: "goose table", Peer: true,
		Note: "lease row polled every Env.Poll ±25%, heartbeat goroutine",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			db, err := openSQLDB(e, s)
			if err != nil {
				return nil, err
			}
			table := e.Schema + ".goose_lock"
			newLocker := func(k int64) (goose.Locker, error) {
				return goose.NewPostgresTableLocker(
					goose.WithTableName(table), goose.WithTableLockID(k),
					goose.WithTableLeaseDuration(leaseTTL),
					goose.WithTableLockTimeout(e.Poll, math.MaxInt32),
					goose.WithTableLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			}
			// Create the lock table once, before any concurrent Lock races to.
			l0, err := newLocker(e.KeyBase)
			if err == nil {
				if err = l0.Lock(ctx, db); err == nil {
					err = l0.Unlock(ctx, db)
				}
			}
			if err != nil {
				db.Close()
				return nil, fmt.Errorf("goose table locker set-up: %w", err)
			}
			return &Instance{
				Worker: func(int) (Op, error) {
					lockers := map[int64]goose.Locker{}
					return func(ctx context.Context, ks []int64, fn func()) error {
						l, ok := lockers[ks[0]]
						if !ok {
							var err error
							if l, err = newLocker(ks[0]); err != nil {
								return err
							}
							lockers[ks[0]] = l
						}
						if err := l.Lock(ctx, db); err != nil {
							return err
						}
						call(fn)
						return l.Unlock(ctx, db)
					}, nil
				},
				Close: func() { db.Close() },
			}, nil
		}}
)

func newRedis(e *Env, s Spec) *redis.Client {
	size := s.PoolSize
	if size <= 0 {
		size = 4
	}
	opts := &redis.Options{Addr: e.RedisAddr, PoolSize: size, DisableIdentity: true}
	if s.Counter != nil {
		opts.Dialer = s.Counter.DialFunc
	}
	return redis.NewClient(opts)
}

func redisKey(k int64) string { return fmt.Sprintf("pgxlockbench:%d", k) }

var (
	redislockObtain = Contender{Name: "bsm/redislock Obtain+Release", Impl: "redislock", Peer: true, Needs: "redis",
		Note: "SET NX PX; retried every Env.Poll (LinearBackoff)",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			rdb := newRedis(e, s)
			lc := redislock.New(rdb)
			return &Instance{
				Worker: func(int) (Op, error) {
					return func(ctx context.Context, ks []int64, fn func()) error {
						opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(e.Poll)}
						l, err := lc.Obtain(ctx, redisKey(ks[0]), leaseTTL, opt)
						if err != nil {
							return err
						}
						call(fn)
						return l.Release(context.WithoutCancel(ctx))
					}, nil
				},
				Close: func() { rdb.Close() },
			}, nil
		}}

	redislockTry = Contender{Name: "bsm/redislock Obtain (no retry)+Release", Impl: "redislock", Peer: true, Needs: "redis",
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			rdb := newRedis(e, s)
			lc := redislock.New(rdb)
			return sameOp(func(ctx context.Context, ks []int64, fn func()) error {
				l, err := lc.Obtain(ctx, redisKey(ks[0]), leaseTTL, nil)
				if errors.Is(err, redislock.ErrNotObtained) {
					return errBusy
				}
				if err != nil {
					return err
				}
				call(fn)
				return l.Release(context.WithoutCancel(ctx))
			}, func() { rdb.Close() }), nil
		}}
)

func redsyncContender(name string, try bool) Contender {
	note := "SET NX PX; retried every Env.Poll; a failed try also runs the release script"
	if try {
		note = "one SET NX PX attempt"
	}
	return Contender{Name: name, Impl: "redsync", Peer: true, Needs: "redis", Note: note,
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			rdb := newRedis(e, s)
			rs := redsync.New(redsyncgoredis.NewPool(rdb))
			return &Instance{
				Worker: func(int) (Op, error) {
					mutexes := map[int64]*redsync.Mutex{}
					return func(ctx context.Context, ks []int64, fn func()) error {
						m, ok := mutexes[ks[0]]
						if !ok {
							m = rs.NewMutex(redisKey(ks[0]), redsync.WithExpiry(leaseTTL),
								redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(e.Poll))
							mutexes[ks[0]] = m
						}
						var err error
						if try {
							err = m.TryLockContext(ctx)
							var taken *redsync.ErrTaken
							if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
								return errBusy
							}
						} else {
							err = m.LockContext(ctx)
						}
						if err != nil {
							return err
						}
						call(fn)
						unlocked, err := m.UnlockContext(context.WithoutCancel(ctx))
						if err == nil && !unlocked {
							err = errNotHeld
						}
						return err
					}, nil
				},
				Close: func() { rdb.Close() },
			}, nil
		}}
}

var (
	redsyncLock = redsyncContender("go-redsync Lock+Unlock", false)
	redsyncTry  = redsyncContender("go-redsync TryLock+Unlock", true)
)

func etcdContender(name string, try bool) Contender {
	note := "Txn + watch of the previous waiter (FIFO), Delete"
	if try {
		note = "Txn, Delete"
	}
	return Contender{Name: name, Impl: "etcd", Peer: true, Needs: "etcd", Note: note,
		New: func(ctx context.Context, e *Env, s Spec) (*Instance, error) {
			cfg := clientv3.Config{Endpoints: []string{e.EtcdEndpoint}, Logger: zapNop()}
			if s.Counter != nil {
				cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
					addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "unix://")
					return s.Counter.DialFunc(ctx, "tcp", addr)
				})}
			}
			cli, err := clientv3.New(cfg)
			if err != nil {
				return nil, err
			}
			var mu sync.Mutex
			var sessions []*concurrency.Session
			return &Instance{
				Worker: func(int) (Op, error) {
					sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(leaseTTL.Seconds())))
					if err != nil {
						return nil, err
					}
					mu.Lock()
					sessions = append(sessions, sess)
					mu.Unlock()
					mutexes := map[int64]*concurrency.Mutex{}
					return func(ctx context.Context, ks []int64, fn func()) error {
						m, ok := mutexes[ks[0]]
						if !ok {
							m = concurrency.NewMutex(sess, fmt.Sprintf("/pgxlockbench/%d", ks[0]))
							mutexes[ks[0]] = m
						}
						if try {
							err := m.TryLock(ctx)
							if errors.Is(err, concurrency.ErrLocked) {
								return errBusy
							}
							if err != nil {
								return err
							}
						} else if err := m.Lock(ctx); err != nil {
							return err
						}
						call(fn)
						return m.Unlock(context.WithoutCancel(ctx))
					}, nil
				},
				Close: func() {
					mu.Lock()
					defer mu.Unlock()
					for _, s := range sessions {
						s.Close()
					}
					cli.Close()
				},
			}, nil
		}}
}

var (
	etcdLock = etcdContender("etcd concurrency.Mutex Lock+Unlock", false)
	etcdTry  = etcdContender("etcd concurrency.Mutex TryLock+Unlock", true)
)
