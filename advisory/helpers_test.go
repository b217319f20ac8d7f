package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// testCtx bounds a test: a guard against hangs, not a performance budget. The
// contention tests (deadlock, mutex, cancel/grant race) do a fixed amount of work, which
// takes minutes under -race on a loaded 2-core machine.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newLocker(t testing.TB, pool *pgxpool.Pool, cfg advisory.Config) *advisory.Locker {
	t.Helper()
	l, err := advisory.New(pool, cfg)
	require.NoError(t, err)
	return l
}

func key(t testing.TB) keys.Key { return keys.Int64(pgtest.UniqueInt64(t)) }

// probe answers, from its own pool (another session), whether keys can be
// taken right now in the given mode; it gives them back at once.
type probe struct {
	t    testing.TB
	pool *pgxpool.Pool
}

func newProbe(t testing.TB) *probe { return &probe{t: t, pool: pgtest.Pool(t)} }

func (p *probe) free(ctx context.Context, k keys.Key, shared bool) bool {
	p.t.Helper()
	fn, unfn := "pg_try_advisory_lock", "pg_advisory_unlock"
	if shared {
		fn, unfn = fn+"_shared", unfn+"_shared"
	}
	var ok bool
	var err error
	if v, isInt := k.Int64(); isInt {
		err = p.pool.QueryRow(ctx, "SELECT "+fn+"($1) AND "+unfn+"($1)", v).Scan(&ok)
	} else {
		a, b, _ := k.Pair()
		err = p.pool.QueryRow(ctx, "SELECT "+fn+"($1, $2) AND "+unfn+"($1, $2)", a, b).Scan(&ok)
	}
	require.NoError(p.t, err)
	return ok
}

// holder holds keys on a dedicated connection of its own pool until
// released; it is the "other session" of contention tests.
type holder struct {
	t    testing.TB
	conn *pgxpool.Conn
}

func hold(ctx context.Context, t testing.TB, shared bool, ks ...keys.Key) *holder {
	t.Helper()
	pool := pgtest.Pool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	h := &holder{t: t, conn: conn}
	fn := "pg_advisory_lock"
	if shared {
		fn += "_shared"
	}
	for _, k := range ks {
		h.exec(ctx, fn, k)
	}
	t.Cleanup(h.release)
	return h
}

func (h *holder) exec(ctx context.Context, fn string, k keys.Key) {
	h.t.Helper()
	var err error
	if v, ok := k.Int64(); ok {
		_, err = h.conn.Exec(ctx, "SELECT "+fn+"($1)", v)
	} else {
		a, b, _ := k.Pair()
		_, err = h.conn.Exec(ctx, "SELECT "+fn+"($1, $2)", a, b)
	}
	require.NoError(h.t, err)
}

// release drops every lock of the holder's session; idempotent.
func (h *holder) release() {
	if h.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := h.conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	require.NoError(h.t, err)
	h.conn.Release()
	h.conn = nil
}

// awaitWaiting blocks until n backends of the database wait for an advisory
// lock on key k (a database state, not a sleep).
func awaitWaiting(ctx context.Context, t testing.TB, pool *pgxpool.Pool, k keys.Key, n int) {
	t.Helper()
	classid, objid, objsubid := k.PgLocks()
	require.Eventually(t, func() bool {
		var c int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid = $2 AND objsubid = $3 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			classid, objid, objsubid).Scan(&c)
		require.NoError(t, err)
		return c >= n
	}, 10*time.Second, time.Millisecond)
}

// showLockTimeout returns SHOW lock_timeout on every connection of pool
// (acquiring all of them at once).
func showLockTimeouts(ctx context.Context, t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	n := int(pool.Stat().TotalConns())
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var out []string
	for i := 0; i < n; i++ {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
		var v string
		require.NoError(t, c.QueryRow(ctx, "SHOW lock_timeout").Scan(&v))
		out = append(out, v)
	}
	return out
}

var _ = pgx.Identifier{}
