package pgxlockmigrate

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// DefaultLockTimeout is the wait bound used when Config.LockTimeout is zero.
// It is below migrate.DefaultLockTimeout (15 s), the bound of Migrate's
// own timer, so that the server ends the wait before Migrate stops
// waiting for it.
const DefaultLockTimeout = 10 * time.Second

// DefaultMigrationsTable is golang-migrate's default migrations table, used
// for the default key when Config.MigrationsTable is empty.
const DefaultMigrationsTable = "schema_migrations"

// timerGrace is how much longer than the driver's wait bound Attach makes
// Migrate's own lock timer, so that the server-side lock_timeout always
// ends the wait first and Migrate never gives up on a Lock call that is
// still running.
const timerGrace = 5 * time.Second

// advisoryLockIDSalt is golang-migrate's salt (database/util.go).
const advisoryLockIDSalt uint32 = 1486364155

// Config configures a Driver. The zero value takes golang-migrate's own lock
// id for the pool's current database and schema and the default migrations
// table, and waits up to DefaultLockTimeout.
type Config struct {
	// Key is the advisory lock key. The zero Key means the key
	// golang-migrate's postgres and pgx drivers take for DatabaseName,
	// SchemaName and MigrationsTable (see [Key]), so that processes on the
	// stock driver and processes on this one exclude each other.
	Key keys.Key

	// DatabaseName, SchemaName, MigrationsTable and MigrationsTableQuoted
	// are the values of the same names in the stock driver's Config
	// (postgres.Config, pgx.Config); they only derive the default Key, and
	// must match the inner driver's for a mixed fleet to exclude itself.
	// An empty DatabaseName or SchemaName is read from the pool
	// (current_database(), current_schema()), as the stock drivers do; an
	// empty MigrationsTable means DefaultMigrationsTable.
	DatabaseName          string
	SchemaName            string
	MigrationsTable       string
	MigrationsTableQuoted bool

	// LockTimeout bounds each wait for the lock. It becomes PostgreSQL's
	// lock_timeout for the lock statement, so the wait ends in the server
	// and leaves nothing behind. Zero means DefaultLockTimeout. It must
	// be positive: an unbounded wait would outlive Migrate's own timer.
	LockTimeout time.Duration

	// OnLost, if set, is called once, from a goroutine of the Driver, when
	// the lock is lost while held (its connection died). It may call
	// Unlock or Close: they do not wait for it to return.
	OnLost func(err error)

	// Advisory configures the advisory.Locker that takes the lock
	// (heartbeats, cleanup bound, tracer, logger). Its LockTimeout is
	// ignored: Config.LockTimeout applies.
	Advisory advisory.Config
}

// Key returns the advisory key golang-migrate's postgres and pgx drivers
// (v4.20) take for a database, a schema and a migrations table:
// database.GenerateAdvisoryLockId(databaseName, schemaName, tableName), a
// single bigint. With quoted true, migrationsTable is parsed as the
// drivers' x-migrations-table-quoted option does (`"schema"."table"` or
// `"table"`). It returns an error matching advisory.ErrInvalid for an
// empty name or a quoted table the drivers would refuse.
func Key(databaseName, schemaName, migrationsTable string, quoted bool) (keys.Key, error) {
	if migrationsTable == "" {
		migrationsTable = DefaultMigrationsTable
	}
	table := migrationsTable
	if quoted {
		m := regexp.MustCompile(`"(.*?)"`).FindAllStringSubmatch(migrationsTable, -1)
		switch {
		case len(m) == 0:
			return keys.Key{}, fmt.Errorf("%w: quoted migrations table %q has no quoted name", advisory.ErrInvalid, clip(migrationsTable))
		case len(m) > 2:
			return keys.Key{}, fmt.Errorf("%w: quoted migrations table %q contains too many dot characters", advisory.ErrInvalid, clip(migrationsTable))
		case len(m) == 2:
			schemaName = m[0][1]
		}
		table = m[len(m)-1][1]
	}
	if databaseName == "" || schemaName == "" {
		return keys.Key{}, fmt.Errorf("%w: empty database or schema name", advisory.ErrInvalid)
	}
	sum := crc32.ChecksumIEEE([]byte(strings.Join([]string{schemaName, table, databaseName}, "\x00")))
	return keys.Int64(int64(sum * advisoryLockIDSalt)), nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Driver is a golang-migrate database.Driver: the inner driver (the stock
// postgres or pgx driver) with Lock and Unlock replaced by an advisory lock
// of this library's. Every other method is the inner driver's.
//
// Lock waits in PostgreSQL, bounded by lock_timeout, under the context
// given to [Wrap]: a wait that times out or is cancelled leaves nothing
// held and never takes the lock later (golang-migrate's own drivers wait
// on context.Background while Migrate's timer gives up, so a timed-out
// Up could still take the lock afterwards). While held, the lock is
// watched as an advisory.Lock is; when it is lost, the Driver begins no
// further migration and Unlock returns an error matching
// advisory.ErrLockLost.
//
// The lock is held on a connection of the pool given to Wrap, not on the
// inner driver's connection, which runs the migrations. A Driver serves one
// Migrate at a time, as the stock drivers do.
type Driver struct {
	database.Driver

	locker  *advisory.Locker
	key     keys.Key
	timeout time.Duration
	ctx     context.Context
	onLost  func(error)

	mu        sync.Mutex
	held      *advisory.Lock
	watchDone chan struct{}
	m         *migrate.Migrate // set by Attach

	// running is held (read side) by each Run, so that Close waits for a
	// migration in flight before it lets the lock go.
	running sync.RWMutex
}

var _ database.Driver = (*Driver)(nil)

// Wrap returns a Driver that takes its lock through pool and runs
// everything else on inner. ctx is used to read the database and schema
// names for the default key (a read that waits for a free connection of
// pool as long as ctx allows: on a pool whose only connection the inner
// driver keeps, pass DatabaseName and SchemaName, or give pool another
// connection) and governs every later wait in Lock: when it
// is cancelled, a waiting Lock returns at once with nothing held, and
// later Locks fail. It returns an error matching advisory.ErrInvalid for a
// nil inner or pool, or a negative LockTimeout.
func Wrap(ctx context.Context, inner database.Driver, pool *pgxpool.Pool, cfg Config) (*Driver, error) {
	if inner == nil || pool == nil {
		return nil, fmt.Errorf("%w: nil inner driver or pool", advisory.ErrInvalid)
	}
	if cfg.LockTimeout < 0 {
		return nil, fmt.Errorf("%w: negative LockTimeout %v", advisory.ErrInvalid, cfg.LockTimeout)
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = DefaultLockTimeout
	}
	key := cfg.Key
	if key.IsZero() {
		if cfg.DatabaseName == "" || cfg.SchemaName == "" {
			var db, schema string
			if err := pool.QueryRow(ctx, "SELECT pg_catalog.current_database(), coalesce(pg_catalog.current_schema(), '')").Scan(&db, &schema); err != nil {
				return nil, fmt.Errorf("pgxlockmigrate: read database and schema names: %w", err)
			}
			if cfg.DatabaseName == "" {
				cfg.DatabaseName = db
			}
			if cfg.SchemaName == "" {
				cfg.SchemaName = schema
			}
		}
		k, err := Key(cfg.DatabaseName, cfg.SchemaName, cfg.MigrationsTable, cfg.MigrationsTableQuoted)
		if err != nil {
			return nil, err
		}
		key = k
	}
	acfg := cfg.Advisory
	acfg.LockTimeout = cfg.LockTimeout
	l, err := advisory.New(pool, acfg)
	if err != nil {
		return nil, err
	}
	return &Driver{Driver: inner, locker: l, key: key, timeout: cfg.LockTimeout, ctx: ctx, onLost: cfg.OnLost}, nil
}

// Key returns the key the Driver locks.
func (d *Driver) Key() keys.Key { return d.key }

// LockTimeout returns the bound of each wait for the lock.
func (d *Driver) LockTimeout() time.Duration { return d.timeout }

// Attach prepares m, a Migrate built on d (migrate.NewWithInstance or
// NewWithDatabaseInstance), and must be called before m first locks: it
// raises m.LockTimeout to d's LockTimeout plus 5 s when it is lower, and
// Lock bounds each wait by m.LockTimeout as it is then, less a margin (5 s,
// or half of it when shorter), so that the server ends every wait before
// Migrate's own timer would abandon it, even if m.LockTimeout was lowered
// after Attach.
func (d *Driver) Attach(m *migrate.Migrate) {
	if min := d.timeout + timerGrace; m.LockTimeout < min {
		m.LockTimeout = min
	}
	d.mu.Lock()
	d.m = m
	d.mu.Unlock()
}

// ErrNotAttached: Lock was called on a Driver no Migrate was attached to
// ([Driver.Attach]). Without it Migrate's own timer may give up on a wait
// that then takes the lock, which nobody would release.
var ErrNotAttached = errors.New("pgxlockmigrate: no Migrate attached to the Driver (call Driver.Attach before Up)")

// waitBound is the bound of Lock's wait: LockTimeout, cut to the attached
// Migrate's LockTimeout less a margin. ok is false when that leaves less
// than the 1 ms PostgreSQL's lock_timeout can express.
func (d *Driver) waitBound() (bound time.Duration, ok bool) {
	bound = d.timeout
	if d.m != nil {
		margin := min(timerGrace, d.m.LockTimeout/2)
		if b := d.m.LockTimeout - margin; b < bound {
			bound = b
		}
	}
	return bound, bound >= time.Millisecond
}

// Lock takes the lock, waiting in PostgreSQL for at most LockTimeout (cut
// to the attached Migrate's LockTimeout less a margin: see Attach) and for
// as long as Wrap's context lasts. Without an attached Migrate it refuses
// with an error matching ErrNotAttached and advisory.ErrInvalid, and with
// one whose LockTimeout is below 2 ms with advisory.ErrInvalid. It returns database.ErrLocked when
// d already holds it, an error matching both migrate.ErrLockTimeout and
// advisory.ErrLockTimeout when the wait timed out (the *pgconn.PgError,
// 55P03, in its chain), the context's error when Wrap's context ended, or
// another advisory error. In every failure nothing is left held.
func (d *Driver) Lock() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held != nil {
		return database.ErrLocked
	}
	if d.m == nil {
		return fmt.Errorf("%w: %w", advisory.ErrInvalid, ErrNotAttached)
	}
	bound, ok := d.waitBound()
	if !ok {
		// Migrate's timer would give up before the shortest wait the
		// server can bound.
		return fmt.Errorf("%w: Migrate.LockTimeout %v is below 2ms", advisory.ErrInvalid, d.m.LockTimeout)
	}
	h, err := d.locker.Lock(d.ctx, d.key, &advisory.Options{Timeout: bound})
	if err != nil {
		if errors.Is(err, advisory.ErrLockTimeout) {
			return errors.Join(migrate.ErrLockTimeout, err)
		}
		return err
	}
	d.held = h
	d.watchDone = make(chan struct{})
	go d.watch(h, d.watchDone)
	return nil
}

// watch waits for h to end and calls OnLost on a loss. Unlock waits for it
// up to the call of OnLost, not through it, so OnLost may call Unlock or
// Close.
func (d *Driver) watch(h *advisory.Lock, done chan struct{}) {
	<-h.Done()
	err := h.Err()
	close(done)
	if errors.Is(err, advisory.ErrLockLost) && d.onLost != nil {
		d.onLost(err)
	}
}

// lost returns the loss of the lock d holds, or nil while it is held (or
// when d holds none: Migrate takes the lock before it migrates).
func (d *Driver) lost() error {
	d.mu.Lock()
	h := d.held
	d.mu.Unlock()
	if h == nil {
		return nil
	}
	if err := h.Err(); errors.Is(err, advisory.ErrLockLost) {
		return err
	}
	return nil
}

// Run runs a migration on the inner driver, unless the lock has been lost:
// then it returns an error matching advisory.ErrLockLost and runs nothing.
func (d *Driver) Run(migration io.Reader) error {
	d.running.RLock()
	defer d.running.RUnlock()
	if err := d.lost(); err != nil {
		return fmt.Errorf("pgxlockmigrate: migration not run: %w", err)
	}
	return d.Driver.Run(migration)
}

// SetVersion records a version on the inner driver. Once the lock is lost,
// it refuses to begin a migration (dirty true) with an error matching
// advisory.ErrLockLost, but records the end of one that began while the
// lock was held (dirty false), so a migration that ran whole under the
// lock is not left marked dirty.
func (d *Driver) SetVersion(version int, dirty bool) error {
	d.running.RLock()
	defer d.running.RUnlock()
	if dirty {
		if err := d.lost(); err != nil {
			return fmt.Errorf("pgxlockmigrate: migration %d not begun: %w", version, err)
		}
	}
	return d.Driver.SetVersion(version, dirty)
}

// Unlock releases the lock. It returns database.ErrNotLocked when d does
// not hold it, an error matching advisory.ErrLockLost when the lock was
// lost while held, or the unlock's error; the lock is released in every
// case (a failed unlock destroys its connection).
func (d *Driver) Unlock() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.held
	if h == nil {
		return database.ErrNotLocked
	}
	d.held = nil
	err := h.Unlock(context.WithoutCancel(d.ctx))
	<-d.watchDone
	return err
}

// Close waits for a migration in flight, or a version being recorded
// (Migrate.Close during Up), releases
// the lock if d still holds it, then closes the inner driver: the lock is
// never let go while a migration it guards still runs.
func (d *Driver) Close() error {
	d.running.Lock()
	defer d.running.Unlock()
	var err error
	d.mu.Lock()
	held := d.held != nil
	d.mu.Unlock()
	if held {
		err = d.Unlock()
	}
	return errors.Join(err, d.Driver.Close())
}
