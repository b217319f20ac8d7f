package suite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/bench/internal/rt"
)

// Op acquires every key of ks (one for most contenders), calls fn (which may
// be nil) while holding them, and releases them. A Try contender returns
// errBusy when a key is held elsewhere.
type Op func(ctx context.Context, ks []int64, fn func()) error

var errBusy = errors.New("bench: busy (try found the lock held)")

// Spec is what an instance of a contender is built with.
type Spec struct {
	PoolSize int           // connections (PostgreSQL or Redis) the instance may use
	Counter  *rt.Counter   // every connection it dials is counted here
	Pool     *pgxpool.Pool // when set, PostgreSQL contenders use this pool instead of their own
}

// Instance is one contender set up for one configuration: its pools and
// clients. Worker(i) gives goroutine i its Op (some peers need per-goroutine
// state, e.g. an etcd session, as separate processes would have).
type Instance struct {
	Worker func(i int) (Op, error)
	Close  func()
}

// Contender is one way of taking a lock: a library call, hand-written pgx,
// or a peer library.
type Contender struct {
	Name  string // unique row label
	Impl  string // "pgxlock", "raw pgx", or the peer's name
	Peer  bool
	Needs string // "" (PostgreSQL only), "redis" or "etcd"
	Note  string
	New   func(ctx context.Context, e *Env, s Spec) (*Instance, error)
}

// Env is what a run has: the database and the optional peer services, plus
// run-wide settings.
type Env struct {
	DSN          string
	RedisAddr    string // "" when unavailable
	EtcdEndpoint string // "" when unavailable
	Unavailable  map[string]string
	Poll         time.Duration // retry interval given to polling peers
	Schema       string        // schema holding lease and goose tables
	KeyBase      int64         // advisory keys of the run start here
	RunID        string
}

// available reports whether c can run in e, and why not.
func (e *Env) available(c *Contender) (bool, string) {
	switch c.Needs {
	case "redis":
		if e.RedisAddr == "" {
			return false, "Redis unavailable: " + e.Unavailable["redis"]
		}
	case "etcd":
		if e.EtcdEndpoint == "" {
			return false, "etcd unavailable: " + e.Unavailable["etcd"]
		}
	}
	return true, ""
}

func newPool(ctx context.Context, e *Env, s Spec) (*pgxpool.Pool, func(), error) {
	if s.Pool != nil {
		return s.Pool, func() {}, nil
	}
	cfg, err := pgxpool.ParseConfig(e.DSN)
	if err != nil {
		return nil, nil, err
	}
	size := s.PoolSize
	if size <= 0 {
		size = 4
	}
	cfg.MaxConns = int32(size)
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgxlockbench"
	if s.Counter != nil {
		cfg.ConnConfig.DialFunc = s.Counter.DialFunc
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, pool.Close, nil
}

// sameOp builds an Instance whose workers all share one Op.
func sameOp(op Op, closeFn func()) *Instance {
	return &Instance{Worker: func(int) (Op, error) { return op, nil }, Close: closeFn}
}

func call(fn func()) {
	if fn != nil {
		fn()
	}
}
