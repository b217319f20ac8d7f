package lease

import (
	"context"
	"errors"
	"fmt"
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
	upgraded  bool          // Shared turned Exclusive by TryUpgrade
	upgrading int           // TryUpgrade calls in flight
	unsure    bool          // a TryUpgrade's outcome is unknown: the row may be either mode
	upgrades  uint64        // TryUpgrade calls started, ever
	stmtBusy  bool          // a Renew or TryUpgrade of this lease is in flight
	stmtFree  chan struct{} // closed when that one ends
}

// beginStmt waits (within ctx) until no other Renew or TryUpgrade of this
// Lease value is in flight, and claims the turn; endStmt gives it back. The
// two statements update the same row: run at once, the upgrade would wait
// for the renewal's row lock, and past TryLockTimeout (a loaded server)
// report the lease busy because of its own renewal. Nothing is sent while
// waiting, so an error here has a known outcome.
func (l *Lease) beginStmt(ctx context.Context) error {
	for {
		l.mu.Lock()
		if !l.stmtBusy {
			l.stmtBusy, l.stmtFree = true, make(chan struct{})
			l.mu.Unlock()
			return nil
		}
		free := l.stmtFree
		l.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return errNothingSent{context.Cause(ctx)}
		}
	}
}

func (l *Lease) endStmt() {
	l.mu.Lock()
	l.stmtBusy = false
	close(l.stmtFree)
	l.mu.Unlock()
}

// Resource returns the leased resource name.
func (l *Lease) Resource() string { return l.resource }

// Owner returns the owner label stored with the lease.
func (l *Lease) Owner() string { return l.owner }

// Mode returns the lease's mode: Exclusive after a successful TryUpgrade,
// and after a TryUpgrade whose outcome was unknown (a lost reply) once a
// Renew has found the row exclusive.
func (l *Lease) Mode() Mode {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.upgraded {
		return Exclusive
	}
	return l.mode
}

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

// matchMode is what Renew and Release require of the row (ownRowSQL's $5):
// "upgraded" once this Shared lease's TryUpgrade turned its row exclusive,
// nil for either its shared row or its upgraded one while a TryUpgrade of
// this Shared lease is in flight or ended with an unknown outcome, else the
// mode the lease holds. It also returns how many
// upgrades had started: a statement that finds no row after an upgrade
// started since may have lost a race with it, and is retried once with the
// mode matched anew (see retryMode).
func (l *Lease) matchMode() (any, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.upgraded && l.mode == Shared:
		return matchUpgraded, l.upgrades
	case l.mode == Shared && (l.upgrading > 0 || l.unsure):
		return nil, l.upgrades
	}
	return l.mode.String(), l.upgrades
}

// retryMode reports whether a statement that matched mode, with upgrades
// started as of then, and found no row should run again with the mode
// matched now: an upgrade started since and changed what the row may be.
func (l *Lease) retryMode(mode any, upgrades uint64) (any, bool) {
	now, n := l.matchMode()
	return now, n != upgrades && now != mode
}

// sawMode records the mode a statement found the row in: a Shared lease
// whose row is exclusive was upgraded by its own TryUpgrade.
func (l *Lease) sawMode(mode string) {
	if mode == Exclusive.String() && l.mode == Shared {
		l.mu.Lock()
		l.upgraded, l.unsure = true, false
		l.mu.Unlock()
	}
}

// Renew extends the lease to the database's now() + TTL. ctx governs the one
// statement. It returns ErrLeaseLost if the lease expired (even if nobody has
// taken it), was released, swept or taken over.
func (l *Lease) Renew(ctx context.Context) (err error) {
	start := time.Now()
	defer func() { l.m.obs.renewed(ctx, l.resource, l.token, start, err) }()
	var expiry *time.Time
	var mode string
	renew := func(match any) error {
		return exec(ctx, l.m.pool, l.m.releaseTimeout, waitCtx|managerTables, func(b *pgx.Batch) {
			b.Queue(l.m.q.renew, l.resource, l.token, l.id, l.ttl, match).QueryRow(func(row pgx.Row) error {
				if err := row.Scan(&expiry, &mode); !errors.Is(err, pgx.ErrNoRows) {
					return err
				}
				return nil
			})
		})
	}
	if err = l.beginStmt(ctx); err != nil {
		return opError("renew", l.resource, err)
	}
	defer l.endStmt()
	match, upgrades := l.matchMode()
	err = renew(match)
	if err == nil && expiry == nil {
		if again, retry := l.retryMode(match, upgrades); retry {
			err = renew(again)
		}
	}
	switch {
	case err != nil:
		return opError("renew", l.resource, err)
	case expiry == nil:
		return opError("renew", l.resource, ErrLeaseLost)
	}
	l.sawMode(mode)
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
	release := func(match any) error {
		return exec(ctx, l.m.pool, l.m.releaseTimeout, waitCtx|managerTables, func(b *pgx.Batch) {
			b.Queue(l.m.q.release, l.resource, l.token, l.id, l.m.channel, match).QueryRow(func(row pgx.Row) error {
				return row.Scan(&n)
			})
		})
	}
	match, upgrades := l.matchMode()
	err := release(match)
	if err == nil && n == 0 {
		if again, retry := l.retryMode(match, upgrades); retry {
			err = release(again)
		}
	}
	if err != nil {
		return opError("release", l.resource, err)
	}
	if n == 0 {
		return opError("release", l.resource, ErrLeaseLost)
	}
	return nil
}

// TryUpgrade turns this Shared lease into an Exclusive one if this is the
// only live holder of the resource, and extends it to now() + TTL; it never
// waits. It returns ErrNotAcquired at once if any other holder is live
// (another reader; two readers that both try to upgrade are both refused,
// never deadlocked), ErrLeaseLost if this lease is no longer live, and
// ErrInvalid if it is not Shared. The fencing token is unchanged: it is
// already greater than every earlier writer's, and every later writer's will
// be greater still. ctx governs the one round trip.
//
// A Renew of this Lease value and TryUpgrade take turns (the one that comes
// second waits, within its ctx, for the other's round trip), so an upgrade
// is never refused because of its own renewal's row lock; a Renew or
// Release that races with it (Do's renewals, say) matches the row whether
// or not the upgrade has committed, so it never reports the upgrade as a
// loss. If its outcome is unknown (the reply was
// lost, or ctx ended after sending), the lease still renews and releases
// whichever mode its row ended in, and Mode reports Exclusive once a Renew
// finds the row exclusive or a repeated TryUpgrade succeeds (it does if the
// lost one had). Until then its Ref names Shared, and a lease resumed from
// that Ref cannot renew or release a row the lost upgrade turned exclusive:
// resolve first (Renew), then take the Ref.
//
// The upgrade gives the row a new lease id (the Ref taken after it carries
// it, with Mode Exclusive), and only the upgraded row of this very lease
// matches in either mode: a Ref edited to claim Shared (an exclusive
// lease's, say) matches nothing, also after a TryUpgrade of it with an
// unknown outcome, and a Ref taken before the upgrade no longer matches.
//
// To wait for the other readers, release and Acquire exclusively instead (see the package
// documentation: an Acquire(Exclusive) while holding Shared waits for itself).
func (l *Lease) TryUpgrade(ctx context.Context) error {
	const op = "try upgrade"
	if l.Mode() != Shared {
		return opError(op, l.resource, fmt.Errorf("%w: only a shared lease can be upgraded", ErrInvalid))
	}
	if err := l.beginStmt(ctx); err != nil {
		return opError(op, l.resource, err)
	}
	defer l.endStmt()
	l.mu.Lock()
	if l.upgraded { // a concurrent TryUpgrade, or a Renew, got there first
		l.mu.Unlock()
		return opError(op, l.resource, fmt.Errorf("%w: only a shared lease can be upgraded", ErrInvalid))
	}
	// An earlier upgrade of unknown outcome may have turned the row
	// exclusive already: then this one finds it so, and succeeds.
	unsure := l.unsure
	l.upgrading++
	l.upgrades++
	l.mu.Unlock()
	var expiry *time.Time
	var mine bool
	err := exec(ctx, l.m.pool, l.m.releaseTimeout, waitTry|managerTables, func(b *pgx.Batch) {
		b.Queue(l.m.q.lockResource, l.resource)
		b.Queue(l.m.q.upgrade, l.resource, l.token, l.id, l.ttl, unsure).QueryRow(func(row pgx.Row) error {
			return row.Scan(&expiry, &mine)
		})
	})
	l.mu.Lock()
	l.upgrading--
	switch {
	case err == nil && mine && expiry != nil:
		l.upgraded, l.unsure, l.expiresAt = true, false, *expiry
	case outcomeUnknown(err):
		l.unsure = true
	}
	l.mu.Unlock()
	switch {
	case isLockTimeout(err):
		return opError(op, l.resource, errors.Join(ErrNotAcquired, err))
	case err != nil:
		return opError(op, l.resource, err)
	case !mine:
		return opError(op, l.resource, ErrLeaseLost)
	case expiry == nil:
		return opError(op, l.resource, fmt.Errorf("%w: other holders are live", ErrNotAcquired))
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
