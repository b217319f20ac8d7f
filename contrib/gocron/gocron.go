package pgxlockgocron

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// Config configures a Locker or an Elector. The zero value hashes names
// with keys.Hash.
type Config struct {
	// Namespace, when not the zero Namespace, derives keys with
	// Namespace.Hash(name) instead of keys.Hash(name), keeping this
	// service's job keys apart from other users of the database.
	Namespace keys.Namespace
}

// key derives the key of a job or election name.
func (c Config) key(name string) (keys.Key, error) {
	if name == "" {
		return keys.Key{}, fmt.Errorf("%w: empty job or election name", advisory.ErrInvalid)
	}
	if c.Namespace == (keys.Namespace{}) {
		return keys.Hash(name), nil
	}
	k, err := c.Namespace.Hash(name)
	if err != nil {
		return keys.Key{}, fmt.Errorf("%w: %v", advisory.ErrInvalid, err)
	}
	return k, nil
}

// Locker implements gocron.Locker (gocron.WithDistributedLocker,
// gocron.WithDistributedJobLocker) with one advisory session lock per job
// run. It is safe for concurrent use.
type Locker struct {
	l   *advisory.Locker
	cfg Config
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking its locks through l. It returns an
// error matching advisory.ErrInvalid for a nil l.
func NewLocker(l *advisory.Locker, cfg Config) (*Locker, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil advisory.Locker", advisory.ErrInvalid)
	}
	return &Locker{l: l, cfg: cfg}, nil
}

// Key returns the advisory key of the job named name.
func (g *Locker) Key(name string) (keys.Key, error) { return g.cfg.key(name) }

// Lock takes the lock of the job named key without waiting and returns its
// handle, an *advisory.Lock, which gocron unlocks after the run. A lock
// held elsewhere gives an error matching advisory.ErrNotAcquired (gocron
// skips the run; where this process holds the key and the pool has no
// free connection, advisory.ErrNoConnection after the connection wait,
// see the package doc); other errors are those of advisory.Locker.TryLock, and
// advisory.ErrInvalid for an empty key. ctx governs only the attempt.
func (g *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	k, err := g.cfg.key(key)
	if err != nil {
		return nil, err
	}
	h, err := g.l.TryLock(ctx, k, nil)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// ErrClosed is returned by Elector.IsLeader after Close.
var ErrClosed = errors.New("pgxlockgocron: elector closed")

// Elector implements gocron.Elector (gocron.WithDistributedElector): the
// scheduler that holds the election's session lock is the leader. It is
// safe for concurrent use. Close it to resign.
type Elector struct {
	l   *advisory.Locker
	key keys.Key

	mu     sync.Mutex
	h      *advisory.Lock // held while leading; nil otherwise
	closed bool
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector returns an Elector for the election called name (its key:
// see the package documentation), taking the lock through l. It does not
// contend yet: the first IsLeader does. It returns an error matching
// advisory.ErrInvalid for a nil l or an empty name.
func NewElector(l *advisory.Locker, name string, cfg Config) (*Elector, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil advisory.Locker", advisory.ErrInvalid)
	}
	k, err := cfg.key(name)
	if err != nil {
		return nil, err
	}
	return &Elector{l: l, key: k}, nil
}

// Key returns the election's advisory key.
func (e *Elector) Key() keys.Key { return e.key }

// IsLeader returns nil if this scheduler leads: it holds the election's
// lock, or takes it now without waiting. Otherwise it returns an error
// matching advisory.ErrNotAcquired (another scheduler leads), or, once
// after this scheduler's lock was lost, an error matching
// advisory.ErrLockLost; the call after that contends again. Other errors
// are those of advisory.Locker.TryLock, and ErrClosed after Close. ctx
// governs only an attempt to take the lock.
func (e *Elector) IsLeader(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.h != nil {
		select {
		case <-e.h.Done():
			// Lost: Unlock returns the loss (and frees the handle).
			err := e.h.Unlock(ctx)
			e.h = nil
			if err == nil {
				err = advisory.ErrLockLost
			}
			return err
		default:
			return nil
		}
	}
	h, err := e.l.TryLock(ctx, e.key, nil)
	if err != nil {
		return err
	}
	e.h = h
	return nil
}

// Close resigns: it releases the lock if held, so that another scheduler
// can lead at its next tick, and makes later IsLeader calls return
// ErrClosed. It returns the unlock's error (see advisory.Lock.Unlock), and
// nil if this scheduler was not leading. It is idempotent.
func (e *Elector) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.h == nil {
		return nil
	}
	h := e.h
	e.h = nil
	return h.Unlock(ctx)
}
