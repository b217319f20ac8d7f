package pgxlockgoose

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/pressly/goose/v3/lock"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Locker implements goose's lock.Locker (goose.WithLocker) with a held
// advisory lock handle (advisory.Locker.Lock) on a connection of the
// Locker's own pgx pool, which must reach the database goose migrates. The
// handle's watcher notices a lost lock (terminated backend, closed socket
// at once; frozen server or partition within the advisory.Config heartbeat
// bounds), and Unlock then reports it, so goose's Up returns an error
// matching advisory.ErrLockLost instead of success. The *sql.DB goose passes
// is not used.
//
// A Locker holds at most one lock at a time: use one per goose.Provider
// (goose serialises a Provider's operations itself).
type Locker struct {
	l    *advisory.Locker
	key  keys.Key
	opts *advisory.Options

	mu sync.Mutex
	h  *advisory.Lock
}

var _ lock.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking cfg.Key (zero: GooseKey) through l,
// waiting up to cfg.LockTimeout (zero: DefaultLockTimeout; negative: the
// context only). cfg.CleanupTimeout is not used: l's Config governs cleanup.
// It returns an error matching advisory.ErrInvalid for a nil l.
func NewLocker(l *advisory.Locker, cfg Config) (*Locker, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil advisory.Locker", advisory.ErrInvalid)
	}
	k := cfg.Key
	if k.IsZero() {
		k = GooseKey
	}
	t := cfg.LockTimeout
	if t == 0 {
		t = DefaultLockTimeout
	}
	return &Locker{l: l, key: k, opts: &advisory.Options{Timeout: t}}, nil
}

// Lock takes the lock, waiting in PostgreSQL. ctx governs only the wait.
// Errors are those of advisory.Locker.Lock, and advisory.ErrInvalid if the
// Locker already holds its lock.
func (g *Locker) Lock(ctx context.Context, _ *sql.DB) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h != nil {
		return fmt.Errorf("%w: pgxlockgoose.Locker already holds %v (one per goose.Provider)", advisory.ErrInvalid, g.key)
	}
	h, err := g.l.Lock(ctx, g.key, g.opts)
	if err != nil {
		return err
	}
	g.h = h
	return nil
}

// Unlock releases the lock. It returns nil, an error matching
// advisory.ErrLockLost if the lock was lost while held (the migrations ran
// partly unprotected: check them), advisory.ErrNotHeld, or
// advisory.ErrInvalid if nothing is held.
func (g *Locker) Unlock(ctx context.Context, _ *sql.DB) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h == nil {
		return fmt.Errorf("%w: pgxlockgoose.Locker holds no lock", advisory.ErrInvalid)
	}
	h := g.h
	g.h = nil
	return h.Unlock(ctx)
}
