package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is one acquisition from a Manager. Its methods are safe for
// concurrent use; it holds no connection.
type Lease struct {
	m          *Manager
	id         string // lease_id column: random, scopes Renew and Release
	resource   string
	owner      string
	mode       Mode
	token      int64
	ttl        time.Duration
	acquiredAt time.Time
	started    time.Time // local monotonic time the winning attempt was sent

	mu        sync.Mutex
	expiresAt time.Time
}

// Resource returns the leased resource name.
func (l *Lease) Resource() string { return l.resource }

// Owner returns the owner label stored with the lease.
func (l *Lease) Owner() string { return l.owner }

// Mode returns the lease's mode.
func (l *Lease) Mode() Mode { return l.mode }

// Token returns the fencing token, strictly greater than every earlier
// acquisition's token for the same resource (any mode).
func (l *Lease) Token() int64 { return l.token }

// TTL returns the lease duration used for this acquisition and its renewals.
func (l *Lease) TTL() time.Duration { return l.ttl }

// AcquiredAt returns the database time of the acquisition.
func (l *Lease) AcquiredAt() time.Time { return l.acquiredAt }

// ExpiresAt returns the database time at which the lease expires unless
// renewed, as of the last successful Renew. It is for display: this package
// never compares it with the local clock.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Renew extends the lease to the database's now() + TTL. ctx governs the one
// statement. It returns ErrLeaseLost if the lease expired (even if nobody has
// taken it), was released, swept or taken over.
func (l *Lease) Renew(ctx context.Context) (err error) {
	start := time.Now()
	defer func() { l.m.obs.renewed(ctx, l.resource, l.token, start, err) }()
	var expiry *time.Time
	err = exec(ctx, l.m.pool, l.m.releaseTimeout, waitCtx, func(b *pgx.Batch) {
		b.Queue(l.m.q.renew, l.resource, l.token, l.id, l.ttl, l.mode.String()).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(&expiry); !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		})
	})
	switch {
	case err != nil:
		return opError("renew", l.resource, err)
	case expiry == nil:
		return opError("renew", l.resource, ErrLeaseLost)
	}
	l.mu.Lock()
	l.expiresAt = *expiry
	l.mu.Unlock()
	return nil
}

// Release deletes the lease and wakes waiters (NOTIFY is sent on commit).
// ctx governs the one round trip; on the way out of a cancelled operation
// pass context.WithoutCancel(ctx) with a timeout (Do does). It returns
// ErrLeaseLost if the lease is no longer this one's: released already, swept,
// or taken over after expiry. Releasing an expired lease nobody removed
// succeeds.
func (l *Lease) Release(ctx context.Context) error {
	var n int64
	err := exec(ctx, l.m.pool, l.m.releaseTimeout, waitCtx, func(b *pgx.Batch) {
		b.Queue(l.m.q.release, l.resource, l.token, l.id, l.m.channel, l.mode.String()).QueryRow(func(row pgx.Row) error {
			return row.Scan(&n)
		})
	})
	if err != nil {
		return opError("release", l.resource, err)
	}
	if n == 0 {
		return opError("release", l.resource, ErrLeaseLost)
	}
	return nil
}

func (l *Lease) keepAlive() keepAlive {
	return keepAlive{
		resource: l.resource,
		ttl:      l.ttl,
		started:  l.started,
		renew:    l.Renew,
		release:  l.Release,
		timeout:  l.m.releaseTimeout,
	}
}
