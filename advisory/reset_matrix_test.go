package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// The reset before a connection goes back to the pool (issue 19): after
// every helper, in every outcome, the next borrower of a pool of one
// connection sees what a fresh connection of that pool sees.

// testRoles creates n roles without login, unique to t, dropped at the end.
func testRoles(t *testing.T, admin *pgxpool.Pool, n int, attrs ...string) []string {
	t.Helper()
	ctx := testCtx(t)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("pgxlock_rt_%d_%d", uint64(pgtest.UniqueInt64(t))%1e12, i)
		a := ""
		if i < len(attrs) {
			a = attrs[i]
		}
		_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{names[i]}.Sanitize()+" "+a)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range names {
			id := pgx.Identifier{r}.Sanitize()
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+id)
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+id)
		}
	})
	return names
}

// borrowerView is what the next borrower of a connection sees.
type borrowerView struct {
	currentUser, sessionUser string
	settings                 string // every non-custom setting, name=value
	custom                   string // the custom setting the callbacks set, or '' / NULL as '-'
	locks, temps, listens    int
	cursors                  int
	cache                    string // the cached statement's error, if any
	lastval                  string // lastval()'s value, or its SQLSTATE (55000 when undefined)
}

const viewSQL = `SELECT current_user::text, session_user::text,
	(SELECT string_agg(name || '=' || setting, ',' ORDER BY name) FROM pg_settings WHERE name NOT LIKE '%.%'),
	coalesce(nullif(current_setting('pgxlock_rt.x', true), ''), '-'),
	(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())::int,
	(SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())::int,
	(SELECT count(*) FROM pg_listening_channels())::int,
	(SELECT count(*) FROM pg_cursors)::int`

// cachedProbeSQL runs through pgx's statement cache: a DEALLOCATE ALL that
// the reset missed makes it fail with 26000.
const cachedProbeSQL = "SELECT $1::int8 + 1"

// nextBorrower borrows pool's connection as any user of the pool would.
func nextBorrowerView(ctx context.Context, t *testing.T, pool *pgxpool.Pool) borrowerView {
	t.Helper()
	var v borrowerView
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	var n int64
	if err := c.QueryRow(ctx, cachedProbeSQL, int64(1)).Scan(&n); err != nil && !c.Conn().IsClosed() {
		// (A closed one was terminated under a batch's reader after the
		// server had run the whole pipeline: pgxpool hands out a dead
		// connection once; that is no state of anyone's.)
		v.cache = err.Error()
	}
	c.Release()
	c, err = pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	require.NoError(t, c.QueryRow(ctx, viewSQL, pgx.QueryExecModeSimpleProtocol).Scan(&v.currentUser, &v.sessionUser, &v.settings, &v.custom,
		&v.locks, &v.temps, &v.listens, &v.cursors))
	var last int64
	var pgErr *pgconn.PgError
	switch err := c.QueryRow(ctx, "SELECT lastval()", pgx.QueryExecModeSimpleProtocol).Scan(&last); {
	case err == nil:
		v.lastval = fmt.Sprint(last)
	case errors.As(err, &pgErr):
		v.lastval = pgErr.Code
	default:
		require.NoError(t, err)
	}
	return v
}

// dirtyState is one kind of session state a callback can leave.
type dirtyState struct {
	name string
	sql  func(r resetFixture) []string
}

// resetFixture is one run's roles and keys.
type resetFixture struct {
	other   string
	lockKey int64
	n       int    // distinguishes names per case
	seq     string // a sequence the pool's role may draw from
}

func resetStates() []dirtyState {
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	return []dirtyState{
		{"set-role", func(r resetFixture) []string { return []string{"SET ROLE " + q(r.other)} }},
		{"session-authorization", func(r resetFixture) []string { return []string{"SET SESSION AUTHORIZATION " + q(r.other)} }},
		{"set-config-role", func(r resetFixture) []string {
			return []string{"SELECT set_config('role', '" + r.other + "', false)"}
		}},
		{"authorization-then-role", func(r resetFixture) []string {
			return []string{"SET SESSION AUTHORIZATION " + q(r.other), "SET ROLE NONE"}
		}},
		{"settings", func(resetFixture) []string {
			return []string{"SET search_path = pg_catalog", "SET statement_timeout = '4321ms'",
				"SET default_transaction_isolation = serializable", "SET TimeZone = 'Asia/Kolkata'"}
		}},
		{"custom-setting", func(resetFixture) []string { return []string{"SET pgxlock_rt.x = '1'"} }},
		{"advisory-lock", func(r resetFixture) []string {
			return []string{fmt.Sprintf("SELECT pg_advisory_lock(%d)", r.lockKey), fmt.Sprintf("SELECT pg_advisory_lock_shared(%d)", r.lockKey+1)}
		}},
		{"temp-table", func(r resetFixture) []string {
			return []string{fmt.Sprintf("CREATE TEMP TABLE rt_tmp_%d (i int)", r.n)}
		}},
		{"listen", func(r resetFixture) []string { return []string{fmt.Sprintf("LISTEN rt_chan_%d", r.n)} }},
		{"cursor-with-hold", func(r resetFixture) []string {
			return []string{fmt.Sprintf("DECLARE rt_cur_%d CURSOR WITH HOLD FOR SELECT 1", r.n)}
		}},
		{"deallocate-all", func(resetFixture) []string { return []string{"DEALLOCATE ALL"} }},
		{"sequence", func(r resetFixture) []string { return []string{"SELECT nextval('" + r.seq + "')"} }},
	}
}

type outcome int

const (
	outNil outcome = iota
	outError
	outPanic
	outCancel
	outExpired
	outLost
)

var outcomeNames = []string{"nil", "error", "panic", "cancel", "expired", "lost"}

var errCallback = errors.New("callback failed")

// testSequence creates a sequence, unique to t, that role may draw from,
// dropped at the end; it returns its quoted name.
func testSequence(t *testing.T, admin *pgxpool.Pool, role string) string {
	t.Helper()
	ctx := testCtx(t)
	name := pgx.Identifier{fmt.Sprintf("rt_seq_%d", uint64(pgtest.UniqueInt64(t))%1e12)}.Sanitize()
	for _, sql := range []string{"CREATE SEQUENCE " + name, "GRANT USAGE ON SEQUENCE " + name + " TO " + pgx.Identifier{role}.Sanitize()} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+name) })
	return name
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// helperCase runs one helper with a callback that applies stmts and ends
// as out. It returns whether the statements ran.
type helperCase func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) bool

type resetEnv struct {
	pool, admin *pgxpool.Pool
	l           *advisory.Locker
}

// callback applies stmts on e and ends as out; cancel ends the call's ctx.
func callback(ctx context.Context, env *resetEnv, e execer, pid uint32, stmts []string, out outcome, cancel func(), ran *bool) error {
	for _, s := range stmts {
		if _, err := e.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	*ran = true
	switch out {
	case outError:
		return errCallback
	case outPanic:
		panic("callback panics")
	case outCancel:
		cancel()
		return nil
	case outExpired:
		<-ctx.Done()
		return nil
	case outLost:
		_, err := env.admin.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid))
		return err
	}
	return nil
}

func runCase(ctx context.Context, out outcome, fn func(ctx context.Context, cancel func())) {
	var cancel context.CancelFunc
	if out == outExpired {
		ctx, cancel = context.WithTimeout(ctx, 150*time.Millisecond)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	defer func() { _ = recover() }()
	fn(ctx, cancel)
}

func sessionHelper(call func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, *pgx.Conn) error) error) helperCase {
	return func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) (ran bool) {
		k := key(t)
		runCase(ctx, out, func(ctx context.Context, cancel func()) {
			_ = call(env.l, ctx, k, func(ctx context.Context, c *pgx.Conn) error {
				return callback(ctx, env, c, c.PgConn().PID(), stmts, out, cancel, &ran)
			})
		})
		return ran
	}
}

func xactHelper(call func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, pgx.Tx) error) error) helperCase {
	return func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) (ran bool) {
		k := key(t)
		runCase(ctx, out, func(ctx context.Context, cancel func()) {
			_ = call(env.l, ctx, k, func(ctx context.Context, tx pgx.Tx) error {
				return callback(ctx, env, tx, tx.Conn().PgConn().PID(), stmts, out, cancel, &ran)
			})
		})
		return ran
	}
}

func batchHelper(try bool) helperCase {
	return func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) (ran bool) {
		k := key(t)
		runCase(ctx, out, func(ctx context.Context, cancel func()) {
			b := &pgx.Batch{}
			for _, s := range stmts {
				b.Queue(s)
			}
			last := b.Queue("SELECT pg_backend_pid()")
			var pid uint32
			last.QueryRow(func(r pgx.Row) error {
				if err := r.Scan(&pid); err != nil {
					return err
				}
				ran = true
				switch out {
				case outError:
					return errCallback
				case outPanic:
					panic("reader panics")
				case outCancel:
					cancel()
				case outLost:
					_, err := env.admin.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid))
					return err
				}
				return nil
			})
			if out == outExpired {
				b.Queue("SELECT pg_sleep(0.3)")
			}
			if try {
				_ = env.l.TryWithXactLockBatch(ctx, []keys.Key{k}, nil, b)
			} else {
				_ = env.l.WithXactLockBatch(ctx, []keys.Key{k}, nil, b)
			}
		})
		return ran
	}
}

func resetHelpers() map[string]helperCase {
	return map[string]helperCase{
		"WithLock": sessionHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, *pgx.Conn) error) error {
			return l.WithLock(ctx, k, nil, fn)
		}),
		"TryWithLock": sessionHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, *pgx.Conn) error) error {
			return l.TryWithLock(ctx, k, nil, fn)
		}),
		"WithLockAll": sessionHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, *pgx.Conn) error) error {
			return l.WithLockAll(ctx, []keys.Key{k, keys.Int64(pgtestUnique())}, nil, fn)
		}),
		"WithXactLock": xactHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, pgx.Tx) error) error {
			return l.WithXactLock(ctx, k, nil, fn)
		}),
		"TryWithXactLock": xactHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, pgx.Tx) error) error {
			return l.TryWithXactLock(ctx, k, nil, fn)
		}),
		"WithXactLockAll": xactHelper(func(l *advisory.Locker, ctx context.Context, k keys.Key, fn func(context.Context, pgx.Tx) error) error {
			return l.WithXactLockAll(ctx, []keys.Key{k, keys.Int64(pgtestUnique())}, nil, fn)
		}),
		"WithXactLockBatch":    batchHelper(false),
		"TryWithXactLockBatch": batchHelper(true),
		"pooltx.WithConn": func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) (ran bool) {
			runCase(ctx, out, func(ctx context.Context, cancel func()) {
				_ = pooltx.WithConn(ctx, env.pool, nil, func(ctx context.Context, c *pooltx.Conn) error {
					return callback(ctx, env, c.Conn(), c.Conn().PgConn().PID(), stmts, out, cancel, &ran)
				})
			})
			return ran
		},
		"pooltx.WithTx": func(ctx context.Context, t *testing.T, env *resetEnv, stmts []string, out outcome) (ran bool) {
			runCase(ctx, out, func(ctx context.Context, cancel func()) {
				_ = pooltx.WithTx(ctx, env.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
					return callback(ctx, env, tx, tx.Conn().PgConn().PID(), stmts, out, cancel, &ran)
				})
			})
			return ran
		},
	}
}

var uniqueSeq = time.Now().UnixNano() % 1e15

func pgtestUnique() int64 { uniqueSeq++; return uniqueSeq }

// newResetEnv builds a pool of ONE connection whose connections start as
// role base (the connection string's RuntimeParams), with a Locker on it.
func newResetEnv(t *testing.T, base string) *resetEnv {
	admin := pgtest.Pool(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.MinConns = 0
	cfg.ConnConfig.RuntimeParams["role"] = base
	pool := pgtest.NewPool(t, cfg)
	return &resetEnv{pool: pool, admin: admin, l: newLocker(t, pool, advisory.Config{})}
}

// TestNextBorrowerSeesAFreshConnection is the matrix helper x state x
// outcome of issue 19 on a pool of one connection: whatever the callback
// (or batch) left, the next borrower sees what a fresh connection of the
// pool sees (current_user and session_user, with a role from the
// connection string; every setting; no advisory lock, temporary table,
// LISTEN or cursor; no currval/lastval; a working statement cache). A custom setting a
// callback creates reads ” afterwards, not NULL (see pooltx's doc), which
// the view folds together.
func TestNextBorrowerSeesAFreshConnection(t *testing.T) {
	admin := pgtest.Pool(t)
	roles := testRoles(t, admin, 2)
	base, other := roles[0], roles[1]
	env := newResetEnv(t, base)
	seq := testSequence(t, admin, base)
	runResetMatrix(t, env, base, other, seq, func(string) bool { return true })
}

// TestIdentityFromAfterConnectIsKept: a pool whose AfterConnect switches
// identity (SET ROLE, or SET SESSION AUTHORIZATION for a superuser login)
// gets that identity back after every helper and outcome, never the
// authenticated user's (here a superuser, which bypasses row-level
// security).
func TestIdentityFromAfterConnectIsKept(t *testing.T) {
	admin := pgtest.Pool(t)
	roles := testRoles(t, admin, 2)
	base, other := roles[0], roles[1]
	seq := testSequence(t, admin, base)
	q := pgx.Identifier{base}.Sanitize()
	for _, connect := range []string{"SET ROLE " + q, "SET SESSION AUTHORIZATION " + q, "SELECT set_config('role', '" + base + "', false)"} {
		t.Run(connect, func(t *testing.T) {
			env := newResetEnvAfterConnect(t, connect)
			runResetMatrix(t, env, base, other, seq, func(state string) bool {
				return strings.Contains(state, "role") || strings.Contains(state, "authorization") || state == "settings"
			})
		})
	}
}

// newResetEnvAfterConnect builds a pool of ONE connection whose
// AfterConnect runs sql, with a Locker on it.
func newResetEnvAfterConnect(t *testing.T, sql string) *resetEnv {
	admin := pgtest.Pool(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.MinConns = 0
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, sql)
		return err
	}
	pool := pgtest.NewPool(t, cfg)
	return &resetEnv{pool: pool, admin: admin, l: newLocker(t, pool, advisory.Config{})}
}

// runResetMatrix runs every helper x every state that want accepts x
// every outcome on env's pool of one connection, whose connections run as
// base, and fails for each case whose next borrower does not see what a
// fresh connection sees.
func runResetMatrix(t *testing.T, env *resetEnv, base, other, seq string, want func(state string) bool) {
	t.Helper()
	ctx := testCtx(t)
	fresh := nextBorrowerView(ctx, t, env.pool)
	require.Equal(t, base, fresh.currentUser)
	require.Equal(t, "-", fresh.custom)
	require.Equal(t, "55000", fresh.lastval, "lastval is undefined in a new session")

	helpers := resetHelpers()
	names := []string{"WithLock", "TryWithLock", "WithLockAll", "WithXactLock", "TryWithXactLock",
		"WithXactLockAll", "WithXactLockBatch", "TryWithXactLockBatch", "pooltx.WithConn", "pooltx.WithTx"}
	n := 0
	var failures []string
	for _, hn := range names {
		h := helpers[hn]
		for _, st := range resetStates() {
			if !want(st.name) {
				continue
			}
			for out := outNil; out <= outLost; out++ {
				if out == outExpired && !strings.Contains(st.name, "role") && st.name != "session-authorization" {
					continue // the slow outcome: identity states only
				}
				n++
				fx := resetFixture{other: other, lockKey: pgtest.UniqueInt64(t), n: n, seq: seq}
				ran := h(ctx, t, env, st.sql(fx), out)
				got := nextBorrowerView(ctx, t, env.pool)
				if got != fresh {
					failures = append(failures, fmt.Sprintf("%s / %s / %s (callback ran: %v): next borrower saw %s",
						hn, st.name, outcomeNames[out], ran, diffView(fresh, got)))
				}
			}
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d cases, %d failed", n, len(failures))
}

func diffView(want, got borrowerView) string {
	var d []string
	if want.currentUser != got.currentUser || want.sessionUser != got.sessionUser {
		d = append(d, fmt.Sprintf("current_user/session_user %s/%s (fresh: %s/%s)", got.currentUser, got.sessionUser, want.currentUser, want.sessionUser))
	}
	if want.settings != got.settings {
		w, g := strings.Split(want.settings, ","), strings.Split(got.settings, ",")
		ws := map[string]bool{}
		for _, s := range w {
			ws[s] = true
		}
		for _, s := range g {
			if !ws[s] {
				d = append(d, "setting "+s)
			}
		}
	}
	if want.custom != got.custom {
		d = append(d, "custom setting "+got.custom)
	}
	if got.locks != want.locks {
		d = append(d, fmt.Sprintf("%d advisory locks", got.locks))
	}
	if got.temps != want.temps {
		d = append(d, fmt.Sprintf("%d temp tables", got.temps))
	}
	if got.listens != want.listens {
		d = append(d, fmt.Sprintf("%d LISTEN", got.listens))
	}
	if got.cache != want.cache {
		d = append(d, "statement cache: "+got.cache)
	}
	if got.cursors != want.cursors {
		d = append(d, fmt.Sprintf("%d cursors", got.cursors))
	}
	if got.lastval != want.lastval {
		d = append(d, "lastval() "+got.lastval)
	}
	return strings.Join(d, "; ")
}

// TestNextRequestSeesOnlyItsTenantsRows: row-level security keyed on
// current_user, two tenant roles and a BYPASSRLS role. Requests run as
// tenant B (the pool's connections start as B: RuntimeParams). Whatever
// identity a helper's callback switched to (tenant A by SET ROLE,
// set_config or SET SESSION AUTHORIZATION, or the BYPASSRLS role), the next
// request on the pool of one connection sees only tenant B's rows.
func TestNextRequestSeesOnlyItsTenantsRows(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	roles := testRoles(t, admin, 3, "", "", "BYPASSRLS")
	tenantA, tenantB, bypass := roles[0], roles[1], roles[2]
	tbl := pgx.Identifier{fmt.Sprintf("rt_rls_%d", uint64(pgtest.UniqueInt64(t))%1e12)}.Sanitize()
	for _, sql := range []string{
		"CREATE TABLE " + tbl + " (tenant text NOT NULL, v int)",
		"ALTER TABLE " + tbl + " ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY own ON " + tbl + " USING (tenant = current_user)",
		fmt.Sprintf("GRANT SELECT ON %s TO %s, %s, %s", tbl, pgx.Identifier{tenantA}.Sanitize(), pgx.Identifier{tenantB}.Sanitize(), pgx.Identifier{bypass}.Sanitize()),
		fmt.Sprintf("INSERT INTO %s VALUES ('%s', 1), ('%s', 2), ('%s', 3)", tbl, tenantA, tenantA, tenantB),
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl) })
	// The pool's connections start as tenant B from the connection string,
	// or from AfterConnect (the login user is then the test's superuser,
	// which row-level security does not hold back).
	for name, env := range map[string]*resetEnv{
		"RuntimeParams role":    newResetEnv(t, tenantB),
		"AfterConnect SET ROLE": newResetEnvAfterConnect(t, "SET ROLE "+pgx.Identifier{tenantB}.Sanitize()),
	} {
		t.Run(name, func(t *testing.T) { checkTenantRows(t, env, tbl, tenantA, tenantB, bypass) })
	}
}

func checkTenantRows(t *testing.T, env *resetEnv, tbl, tenantA, tenantB, bypass string) {
	ctx := testCtx(t)
	visible := func() (own, others int) {
		t.Helper()
		require.NoError(t, env.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE tenant = $1), count(*) FILTER (WHERE tenant <> $1) FROM "+tbl, tenantB).
			Scan(&own, &others))
		return own, others
	}
	own, others := visible()
	require.Equal(t, [2]int{1, 0}, [2]int{own, others}, "a fresh connection as tenant B")

	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	switches := map[string][]string{
		"set-role-tenant":      {"SET ROLE " + q(tenantA)},
		"set-config-tenant":    {"SELECT set_config('role', '" + tenantA + "', false)"},
		"authorization-tenant": {"SET SESSION AUTHORIZATION " + q(tenantA)},
		"set-role-bypassrls":   {"SET ROLE " + q(bypass)},
		"authorization-bypass": {"SET SESSION AUTHORIZATION " + q(bypass)},
	}
	for hn, h := range resetHelpers() {
		for sn, stmts := range switches {
			for _, out := range []outcome{outNil, outError} {
				h(ctx, t, env, append(stmts, "SELECT count(*) FROM "+tbl), out)
				own, others := visible()
				if own != 1 || others != 0 {
					t.Errorf("%s / %s / %s: the next request as tenant B saw %d of its rows and %d of other tenants'", hn, sn, outcomeNames[out], own, others)
				}
			}
		}
	}
}

// TestResetRestoresRoleFromAlterRoleSet: a connection whose role comes from
// ALTER ROLE ... SET role (not the DSN) gets that role back after a
// callback's SET ROLE; and what the reset documents it does not undo holds:
// a custom setting the callback created reads ” (not NULL), a statement it
// prepared stays prepared.
func TestResetRestoresRoleFromAlterRoleSet(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	roles := testRoles(t, admin, 3, "LOGIN")
	login, tenant, other := roles[0], roles[1], roles[2]
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	for _, sql := range []string{
		"GRANT " + q(tenant) + ", " + q(other) + " TO " + q(login),
		"ALTER ROLE " + q(login) + " SET role = " + q(tenant),
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.User = login
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})

	var cur string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user::text").Scan(&cur))
	require.Equal(t, tenant, cur, "a fresh connection runs as the role of ALTER ROLE ... SET role")
	require.NoError(t, l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error {
		for _, sql := range []string{"SET ROLE " + q(other), "SET pgxlock_rt.y = '1'", "PREPARE rt_kept AS SELECT 1"} {
			if _, err := c.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	}))
	var custom *string
	var prepared int
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_user::text, current_setting('pgxlock_rt.y', true),
		(SELECT count(*) FROM pg_prepared_statements WHERE name = 'rt_kept')::int`, pgx.QueryExecModeSimpleProtocol).
		Scan(&cur, &custom, &prepared))
	require.Equal(t, tenant, cur, "the next borrower runs as the role the connection started with")
	require.NotNil(t, custom)
	require.Equal(t, "", *custom, "a custom setting a callback created reads '' afterwards, not NULL")
	require.Equal(t, 1, prepared, "a statement the callback prepared stays prepared")
}

// TestHandleUnlocksWithoutReset: a handle's connection runs only this
// package's statements, so its Unlock is the unlock alone (the last
// statement its backend ran), while WithLock's ends with the reset.
func TestHandleUnlocksWithoutReset(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	l := newLocker(t, pool, advisory.Config{})
	lastQuery := func(pid uint32) string {
		var q string
		require.NoError(t, admin.QueryRow(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&q))
		return q
	}
	var pid uint32
	require.NoError(t, l.WithLock(ctx, key(t), nil, func(ctx context.Context, c *pgx.Conn) error {
		pid = c.PgConn().PID()
		_, err := c.Exec(ctx, "SELECT 1")
		return err
	}))
	require.Contains(t, lastQuery(pid), "RESET ALL", "a callback's connection is reset")
	h, err := l.Lock(ctx, key(t), nil)
	require.NoError(t, err)
	require.NoError(t, h.Unlock(ctx))
	q := lastQuery(pid)
	require.Contains(t, q, "pg_advisory_unlock", "the handle ran on the pool's one connection")
	require.NotContains(t, q, "RESET", "a handle's unlock needs no reset")
}
