package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ManagerConfig describes a lock-manager table. The zero value of every field
// except TTL is a documented default.
type ManagerConfig struct {
	// Schema holding the tables. Empty: the connection's search_path decides.
	Schema string
	// Table holding one row per lease holder. Default "pgxlock_leases". A
	// companion table named Table+"_resources" holds one row per resource
	// ever leased: its fencing counter and any waiting writer's intent. At
	// most MaxTableLen bytes, without a dot (the schema goes in Schema).
	Table string
	// TTL of a lease when AcquireOptions.TTL is zero, and of every renewal
	// of a resumed lease (see Resume). Required, at least MinTTL.
	TTL time.Duration
	// Owner label stored with each lease when AcquireOptions.Owner is empty.
	// ReleaseAll and List select by it. Default "<hostname>:<pid>".
	Owner string
	// PollInterval bounds how long a blocking Acquire waits between attempts
	// when no notification arrives (a lease that expires sends none). Each wait
	// is a random duration in [PollInterval/2, PollInterval], shortened to the
	// earliest expiry of a blocking lease. A waiting writer's intent lasts
	// 3*PollInterval (at most time.Duration's largest value, about 292
	// years) and is refreshed at each attempt. Default 1s.
	PollInterval time.Duration
	// Channel for LISTEN/NOTIFY. Default "pgxlock_lease_" + 16 hex digits
	// derived from the table name as configured (Schema and Table), so two
	// tables configured with different names never share one. The name is
	// not resolved: with Schema empty, two tables of the same name in
	// different schemas, reached through different search_paths, share a
	// channel. That costs wake-ups, not correctness (a waiter woken by the
	// other table's release tries again and finds its own resource still
	// held); set Schema, or Channel, to keep them apart.
	Channel string
	// ReleaseTimeout bounds the release Do runs after its callback, the
	// give-back after an acquisition whose outcome is unknown, the clearing
	// of an abandoned writer intent, and closing the LISTEN connection; the
	// steps of one call run concurrently, so a call overshoots its context's
	// deadline by at most one ReleaseTimeout. Default 5s.
	ReleaseTimeout time.Duration
	// Tracer, when set, receives every renewal (see RenewTracer).
	Tracer RenewTracer
	// Logger receives renewals (Debug; failures at Warn). Resources are
	// logged as given. Nil means no logging.
	Logger *slog.Logger
}

// DefaultTable is the lock-manager table name used when ManagerConfig.Table is empty.
const DefaultTable = "pgxlock_leases"

// intentTTL is how long a waiting writer's intent lasts: 3*PollInterval,
// saturated rather than wrapped (a PollInterval over a third of
// time.Duration's range would otherwise store an intent already expired).
func (m *Manager) intentTTL() time.Duration {
	if m.poll > math.MaxInt64/3 {
		return math.MaxInt64
	}
	return 3 * m.poll
}

// DefaultPollInterval is the wait bound used when ManagerConfig.PollInterval is zero.
const DefaultPollInterval = time.Second

// Mode is the kind of lease a lock-manager acquisition asks for.
type Mode uint8

const (
	// Exclusive (the zero value) excludes every other holder: one writer.
	Exclusive Mode = iota
	// Shared coexists with other Shared holders and excludes Exclusive
	// ones: many readers, no writer. See the package documentation for the
	// writer-preference policy.
	Shared
)

// String returns "exclusive" or "shared", the value stored in the mode column.
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

func parseMode(s string) (Mode, error) {
	switch s {
	case "exclusive":
		return Exclusive, nil
	case "shared":
		return Shared, nil
	}
	return 0, fmt.Errorf("lease: unknown mode %q in table", s)
}

// AcquireOptions are per-call settings; a nil pointer means all defaults.
type AcquireOptions struct {
	Mode     Mode            // Default Exclusive.
	TTL      time.Duration   // Default ManagerConfig.TTL; else at least MinTTL.
	Owner    string          // Default ManagerConfig.Owner.
	Metadata json.RawMessage // Stored in the metadata jsonb column; nil stores NULL.
}

// Manager acquires leases from a lock-manager table. It is safe for concurrent
// use. Between calls it holds no connection; while at least one blocking
// Acquire waits, it holds one dedicated (not pooled) connection for LISTEN.
type Manager struct {
	pool           *pgxpool.Pool
	holders        string // quoted, qualified
	resources      string // quoted, qualified
	channel        string // raw channel name, passed to pg_notify as a value
	ttl            time.Duration
	owner          string
	poll           time.Duration
	releaseTimeout time.Duration
	q              managerSQL
	lis            *listener
	obs            observer
}

// NewManager validates cfg and prepares the statements. It sends nothing to
// the database; call Migrate once to create the tables. Errors wrap ErrInvalid.
func NewManager(pool *pgxpool.Pool, cfg ManagerConfig) (*Manager, error) {
	const op = "new manager"
	if pool == nil {
		return nil, opError(op, "", fmt.Errorf("%w: nil pool", ErrInvalid))
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.Owner == "" {
		cfg.Owner = defaultOwner()
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.ReleaseTimeout == 0 {
		cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	if cfg.Schema != "" {
		if err := checkIdentifier("schema", cfg.Schema); err != nil {
			return nil, opError(op, "", err)
		}
	}
	if err := checkTable(cfg.Table); err != nil {
		return nil, opError(op, "", err)
	}
	if len(cfg.Table) > MaxTableLen {
		return nil, opError(op, "", fmt.Errorf("%w: table is longer than %d bytes (the limit leaves room for the derived names, such as %q)",
			ErrInvalid, MaxTableLen, tableNames("t").expiryIndex))
	}
	names := tableNames(cfg.Table)
	for what, name := range map[string]string{
		"table": names.holders, "resource table": names.resources,
		"owner index": names.ownerIndex, "expiry index": names.expiryIndex,
	} {
		if err := checkIdentifier(what, name); err != nil {
			return nil, opError(op, "", err)
		}
	}
	holders := qualify(cfg.Schema, names.holders)
	if cfg.Channel == "" {
		cfg.Channel = defaultChannel(holders)
	}
	if err := checkIdentifier("channel", cfg.Channel); err != nil {
		return nil, opError(op, "", err)
	}
	if err := checkText("owner", cfg.Owner, MaxResourceLen); err != nil {
		return nil, opError(op, "", err)
	}
	if err := checkTTL(cfg.TTL); err != nil {
		return nil, opError(op, "", err)
	}
	switch {
	case cfg.PollInterval < time.Millisecond:
		return nil, opError(op, "", fmt.Errorf("%w: poll interval must be at least 1ms, got %v", ErrInvalid, cfg.PollInterval))
	case cfg.ReleaseTimeout < 0:
		return nil, opError(op, "", fmt.Errorf("%w: negative release timeout", ErrInvalid))
	}
	m := &Manager{
		pool:           pool,
		holders:        holders,
		resources:      qualify(cfg.Schema, names.resources),
		channel:        cfg.Channel,
		ttl:            cfg.TTL,
		owner:          cfg.Owner,
		poll:           cfg.PollInterval,
		releaseTimeout: cfg.ReleaseTimeout,
		obs:            newObserver(FormManager, cfg.Tracer, cfg.Logger),
	}
	// One pass: a configured name that contains a placeholder, such as
	// "t{next_fence}", is quoted into the SQL and never substituted again.
	m.q = newManagerSQL(strings.NewReplacer(
		"{holders}", m.holders, "{resources}", m.resources,
		"{owner_idx}", quote(names.ownerIndex), "{expiry_idx}", quote(names.expiryIndex),
		"{next_fence}", nextTokenSQL("r.fence"),
	))
	m.q.upToDate = relationsExistSQL
	m.q.upToDateArgs = []any{m.holders, m.resources, qualify(cfg.Schema, names.ownerIndex), qualify(cfg.Schema, names.expiryIndex)}
	m.lis = newListener(pool, cfg.Channel, cfg.PollInterval, cfg.ReleaseTimeout)
	return m, nil
}

// MaxTableLen is the longest ManagerConfig.Table accepted, in bytes:
// PostgreSQL's 63-byte identifier limit minus the longest suffix of a derived
// name ("_expires_idx").
const MaxTableLen = maxIdentifierLen - len("_expires_idx")

type derivedNames struct{ holders, resources, ownerIndex, expiryIndex string }

func tableNames(table string) derivedNames {
	return derivedNames{
		holders:     table,
		resources:   table + "_resources",
		ownerIndex:  table + "_owner_idx",
		expiryIndex: table + "_expires_idx",
	}
}

// Channel returns the LISTEN/NOTIFY channel name.
func (m *Manager) Channel() string { return m.channel }

// request is one validated acquisition, shared by its attempts.
type request struct {
	op       string
	resource string
	leaseID  string // fresh per call; every attempt of one call uses it
	owner    string
	mode     Mode
	ttl      time.Duration
	metadata any    // nil or the JSON text
	intent   string // non-empty: a blocking writer registers this intent when blocked
	wait     wait   // how long an attempt may wait for the resource's row lock
}

func (m *Manager) newRequest(op, resource string, opts *AcquireOptions) (*request, error) {
	if opts == nil {
		opts = &AcquireOptions{}
	}
	r := &request{op: op, resource: resource, leaseID: newID(), owner: opts.Owner, mode: opts.Mode, ttl: opts.TTL}
	if err := checkText("resource", resource, MaxResourceLen); err != nil {
		return nil, opError(op, resource, err)
	}
	if r.owner == "" {
		r.owner = m.owner
	} else if err := checkText("owner", r.owner, MaxResourceLen); err != nil {
		return nil, opError(op, resource, err)
	}
	if r.mode != Exclusive && r.mode != Shared {
		return nil, opError(op, resource, fmt.Errorf("%w: unknown mode %v", ErrInvalid, r.mode))
	}
	if r.ttl == 0 {
		r.ttl = m.ttl
	} else if err := checkTTL(r.ttl); err != nil {
		return nil, opError(op, resource, err)
	}
	if opts.Metadata != nil {
		if err := checkMetadata(opts.Metadata); err != nil {
			return nil, opError(op, resource, err)
		}
		r.metadata = string(opts.Metadata)
	}
	return r, nil
}

// TryAcquire makes one attempt at the lease and never waits for a holder; it
// waits at most TryLockTimeout for a row lock held by another transaction.
// ctx governs the attempt. It returns ErrNotAcquired if a live lease
// conflicts (for Shared, also a live writer intent: see the package docs) or
// the resource's row stays locked past TryLockTimeout, and ErrInvalid for
// bad input. If the attempt's outcome is unknown (connection failure, ctx
// ended after sending) any lease it may have created is deleted under a
// fresh context bounded by ReleaseTimeout before the error returns, so
// TryAcquire returns within ctx's deadline plus one ReleaseTimeout.
func (m *Manager) TryAcquire(ctx context.Context, resource string, opts *AcquireOptions) (*Lease, error) {
	req, err := m.newRequest("try acquire", resource, opts)
	if err != nil {
		return nil, err
	}
	ctx = withCleanupClock(ctx)
	l, cleanup, err := m.tryAcquire(ctx, req)
	if cleanup != nil {
		cctx, cancel := cleanupContext(ctx, m.releaseTimeout)
		cleanup(cctx)
		cancel()
	}
	return l, err
}

// tryAcquire is TryAcquire's attempt; a non-nil cleanup gives back an
// attempt whose outcome is unknown (see Manager.acquire).
func (m *Manager) tryAcquire(ctx context.Context, req *request) (*Lease, func(context.Context), error) {
	req.wait = waitTry
	l, _, err := m.attempt(ctx, req)
	if outcomeUnknown(err) {
		return l, func(cctx context.Context) { m.giveBack(cctx, req) }, err
	}
	return l, nil, err
}

// attempt runs the acquisition batch once. On ErrNotAcquired it also returns
// how long, by the database clock, until the earliest conflicting lease or
// intent expires (0 when unknown). It does not give back an attempt whose
// outcome is unknown (outcomeUnknown(err)): the caller does, once, together
// with whatever else it must clean up.
func (m *Manager) attempt(ctx context.Context, req *request) (*Lease, time.Duration, error) {
	started := time.Now()
	restartCleanupClock(ctx) // an earlier attempt's ROLLBACK ended no call
	var intent any
	if req.intent != "" {
		intent = req.intent
	}
	// One transaction, one round trip: the first statement locks the
	// resource's counter row, the second (with a fresh READ COMMITTED
	// snapshot, taken after the lock) decides.
	var (
		token              *int64
		acquiredAt, expiry *time.Time
		retryAfter         *float64
	)
	err := exec(ctx, m.pool, m.releaseTimeout, req.wait|managerTables, func(b *pgx.Batch) {
		b.Queue(m.q.lockResource, req.resource)
		b.Queue(m.q.acquire, req.resource, req.mode.String(), req.leaseID, req.owner, req.ttl,
			req.metadata, intent, m.intentTTL()).QueryRow(func(row pgx.Row) error {
			return row.Scan(&token, &acquiredAt, &expiry, &retryAfter)
		})
	})
	switch {
	case isLockTimeout(err): // the resource row is locked by a transaction: busy
		return nil, 0, opError(req.op, req.resource, errors.Join(ErrNotAcquired, err))
	case err != nil:
		return nil, 0, opError(req.op, req.resource, err)
	case token == nil:
		var wait time.Duration
		if retryAfter != nil && *retryAfter > 0 {
			// A blocker whose expiry is beyond time.Duration's range (a row
			// edited by hand to a far future; 'infinity' gives no hint at
			// all) must not wrap to a negative wait.
			wait = time.Duration(math.MaxInt64)
			if s := *retryAfter * float64(time.Second); s < float64(math.MaxInt64) {
				wait = time.Duration(s)
			}
		}
		return nil, wait, opError(req.op, req.resource, ErrNotAcquired)
	}
	return &Lease{
		m: m, id: req.leaseID, resource: req.resource, owner: req.owner, mode: req.mode,
		token: *token, ttl: req.ttl, acquiredAt: *acquiredAt, expiresAt: *expiry, started: started,
	}, 0, nil
}

// giveBack deletes the lease row an attempt with an unknown outcome may have
// created and clears the writer intent the request may have registered
// (req.intent), waking
// waiters if anything went.
//
// It first takes the resource lock, like an acquisition: an abandoned attempt
// that is still queued for that lock on the server (its client gone, its
// statements and Sync already received) runs and commits before the
// give-back looks, instead of after it. Best effort: if it fails, or the
// abandoned attempt reaches the server later still, the TTL (or the intent's
// lifetime) is the safety net.
//
// gctx is a clean-up context the caller made and bounded (by ReleaseTimeout:
// cleanupContext), so that several give-backs can share one bound.
func (m *Manager) giveBack(gctx context.Context, req *request) {
	var intent any
	if req.intent != "" {
		intent = req.intent
	}
	_ = exec(gctx, m.pool, m.releaseTimeout, waitCtx|managerTables, func(b *pgx.Batch) {
		b.Queue(m.q.lockResource, req.resource)
		b.Queue(m.q.giveBack, req.resource, req.leaseID, intent, m.channel)
	})
}
