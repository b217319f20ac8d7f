package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// ErrTxAborted: a call inside the caller's transaction (LockInTx and
// friends) found that transaction, or left it, unusable: PostgreSQL aborted
// it (SQLSTATE 25P02 for every statement until ROLLBACK), or its connection
// closed. Roll it back. The other errors of those calls leave the
// transaction as it was.
var ErrTxAborted = errors.New("advisory: the transaction is aborted or its connection closed")

// LockInTx takes key with pg_advisory_xact_lock inside tx, a transaction
// the caller began and owns: from a pool, from a single pgx.Conn, or a
// nested pgx transaction (a savepoint, from tx.Begin). The lock lasts until
// tx's transaction ends (commit or rollback) or, for a nested pgx
// transaction, until that savepoint is rolled back; it cannot be released
// earlier. The Locker's pool is not used, and the call does not queue in
// process behind the Locker's other calls: its wait is on the server, where
// PostgreSQL's deadlock detector sees it together with every other lock of
// tx.
//
// The call runs in a savepoint of its own, in one round trip when the key
// is granted: SAVEPOINT, the lock, RELEASE SAVEPOINT (a lock taken in a
// released savepoint belongs to the enclosing transaction). That holds in
// the Exec and SimpleProtocol exec modes, and in the statement-caching ones
// once pgx has the statements prepared; pgx drops them from its caches
// after any failed batch on the connection (a timeout, busy keys of a
// multi-key try, a deadlock), so the next call there re-prepares them (one
// or two round trips more, once), and DescribeExec describes every time
// (two round trips). A bounded wait
// sets lock_timeout inside the lock statement and sets it back, in the same
// statement, to the value tx had, so whatever tx had (a SET LOCAL, or the
// session's value) is what tx has afterwards; the bound replaces tx's
// lock_timeout for the call's wait only. When the wait fails, one more
// round trip, ROLLBACK TO SAVEPOINT and RELEASE SAVEPOINT under a fresh
// context bounded by Config.CleanupTimeout, undoes the call: nothing of it
// stays held or set, and tx is usable as before (a failed statement would
// otherwise abort the whole transaction).
//
// The wait is bounded by Options.Timeout, else Config.LockTimeout, and by
// ctx's deadline, whichever comes first; reaching the bound ends the wait on
// the server with ErrLockTimeout. Without any bound, tx's own lock_timeout
// (if any) applies. A cancelled ctx sends PostgreSQL a cancel request, as
// for WithLock, and the call returns ctx's error; a call whose ctx has
// ended before anything was sent sends nothing. A server that ends the wait
// neither at the bound nor on the cancel request within half a second (a
// frozen server or network) gets its socket cut: tx's connection closes and
// the error also matches ErrTxAborted. A nil error means the key is held
// by tx. Options.Shared takes it in shared mode; Options.TxOptions is
// ignored.
//
// It returns a *LockError matching ErrLockTimeout, ErrDeadlock,
// ErrTooManyLocks (tx is usable in these cases, as after a cancellation),
// ErrInvalid (no SQL was sent: a nil tx or zero key, or tx not in a
// transaction: committed, rolled back, or ended by its own SQL) or
// ErrTxAborted (tx was aborted or its connection closed, before or during
// the call) or ErrStandby (tx's server is a hot standby: no SQL was sent,
// tx is usable); the *pgconn.PgError and ctx's error stay in its chain.
// Acquisitions are traced (AcquireTracer) as for WithXactLock, with
// ScopeXact and TraceAcquireStartData.CallerTx; the release is not, as the
// transaction's end belongs to the caller.
func (l *Locker) LockInTx(ctx context.Context, tx pgx.Tx, key keys.Key, opts *Options) error {
	c := &inTxCall{}
	c.key1[0] = key
	return l.lockInTx(ctx, c, tx, c.key1[:], opts, false)
}

// TryLockInTx is LockInTx without waiting: when key is held in a
// conflicting mode by another session it returns a *LockError matching
// ErrNotAcquired, nothing is held and tx is usable as before. It costs one
// round trip whether or not the key is free. Its statement runs on tx's
// connection under ctx alone (the connection is the caller's, not the
// Locker's to cut): a server or network that does not answer holds the
// call until ctx ends (and at most half a second more).
func (l *Locker) TryLockInTx(ctx context.Context, tx pgx.Tx, key keys.Key, opts *Options) error {
	c := &inTxCall{}
	c.key1[0] = key
	return l.lockInTx(ctx, c, tx, c.key1[:], opts, true)
}

// LockAllInTx is LockInTx for several keys, sorted by keys.Compare,
// de-duplicated and taken in that order by one statement, so that callers
// that pass every key of a critical section to one call never deadlock each
// other. The bound covers the whole wait, all keys together (before each
// key, lock_timeout is set to what the earlier ones left of it, measured on
// the server). A failure part-way releases every key the call took (ROLLBACK
// TO its savepoint), and nothing else of tx.
func (l *Locker) LockAllInTx(ctx context.Context, tx pgx.Tx, ks []keys.Key, opts *Options) error {
	return l.lockInTx(ctx, &inTxCall{}, tx, ks, opts, false)
}

// TryLockAllInTx is LockAllInTx without waiting, all or nothing: if any key
// is busy, every key the call took is released and the error matches
// ErrNotAcquired. A busy set costs a second round trip (the ROLLBACK TO
// SAVEPOINT).
func (l *Locker) TryLockAllInTx(ctx context.Context, tx pgx.Tx, ks []keys.Key, opts *Options) error {
	return l.lockInTx(ctx, &inTxCall{}, tx, ks, opts, true)
}

// The savepoint of an in-tx call. Savepoint names may
// repeat in PostgreSQL; RELEASE and ROLLBACK TO find the most recent one,
// which is always the call's own.
const (
	sqlInTxSavepoint = "SAVEPOINT pgxlock_lock"
	sqlInTxRelease   = "RELEASE SAVEPOINT pgxlock_lock"
	sqlInTxUndo      = "ROLLBACK TO SAVEPOINT pgxlock_lock; RELEASE SAVEPOINT pgxlock_lock"
)

// inTxSQL holds the in-tx statements, by shared mode. Each takes every key
// of a call in one statement: $1 int8[] (the int8 keys), $2 and $3 int4[]
// (the pairs), in keys.Compare order (sp, n), the locks evaluated after the
// sort. bound also takes $4, the bound in ms: before each key lock_timeout
// is set to what is left of it since the statement began (at least 1 ms),
// and after the last key (the aggregate runs once every row is done) it is
// set back to the value the statement found; a failed wait never reaches
// that, and the ROLLBACK TO SAVEPOINT that follows restores it. tryAll
// divides by zero (22012) when any key was busy, so that the statements
// queued after it (RELEASE SAVEPOINT) do not run and the keys taken can be
// undone.
var inTxSQL [2]struct{ all, bound, tryAll string }

func init() {
	const keysFrom = `(SELECT 1 AS sp, n, k, NULL::pg_catalog.int4 AS a, NULL::pg_catalog.int4 AS b FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[])) WITH ORDINALITY AS x(k, n)
 UNION ALL SELECT 2, n, NULL, a, b FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int4[])) WITH ORDINALITY AS y(a, b, n)) AS u`
	for shared := 0; shared < 2; shared++ {
		suffix := ""
		if shared == 1 {
			suffix = "_shared"
		}
		lock := fmt.Sprintf("CASE WHEN a IS NULL THEN %[1]s%[2]s(k) ELSE %[1]s%[2]s(a, b) END", funcNames[kindXactLock], suffix)
		try := fmt.Sprintf("CASE WHEN a IS NULL THEN %[1]s%[2]s(k) ELSE %[1]s%[2]s(a, b) END", funcNames[kindTryXactLock], suffix)
		inTxSQL[shared].all = "SELECT " + lock + " FROM " + keysFrom + " ORDER BY sp, n"
		inTxSQL[shared].bound = "SELECT pg_catalog.set_config('lock_timeout', pg_catalog.min(v), true) FROM (SELECT v, " +
			"pg_catalog.set_config('lock_timeout', (greatest(1, $4::pg_catalog.int8 OPERATOR(pg_catalog.-) ((extract(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) t0) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8))::pg_catalog.text OPERATOR(pg_catalog.||) 'ms'), true) AS s, " +
			lock + " AS l FROM (SELECT pg_catalog.current_setting('lock_timeout') AS v, pg_catalog.clock_timestamp() AS t0 OFFSET 0) AS i, " +
			keysFrom + " ORDER BY sp, n) AS o"
		inTxSQL[shared].tryAll = "SELECT 1 OPERATOR(pg_catalog./) pg_catalog.min(ok::pg_catalog.int4) FROM (SELECT " + try + " AS ok FROM " + keysFrom + " ORDER BY sp, n) AS o"
	}
}

// inTxCall is the state of one in-tx call.
type inTxCall struct {
	s    keySet
	key1 [1]keys.Key
	sp   span
	w    serverWait
	bw   boundWait // the bound of the wait (waitBound)

	ints   []int64
	as, bs []int32
	ms     int64
}

// args returns the key arrays of the set (and, when bounded, the bound) as
// the arguments of an inTxSQL statement.
func (c *inTxCall) args(bounded bool) []any {
	for _, k := range c.s.all {
		if v, ok := k.Int64(); ok {
			c.ints = append(c.ints, v)
		} else if a, b, ok := k.Pair(); ok {
			c.as = append(c.as, a)
			c.bs = append(c.bs, b)
		}
	}
	if c.ints == nil {
		c.ints = []int64{}
	}
	if c.as == nil {
		c.as, c.bs = []int32{}, []int32{}
	}
	if bounded {
		return []any{c.ints, c.as, c.bs, c.ms}
	}
	return []any{c.ints, c.as, c.bs}
}

func (l *Locker) lockInTx(ctx context.Context, c *inTxCall, tx pgx.Tx, ks []keys.Key, opts *Options, try bool) error {
	shared := opts.shared()
	op := opName(xactOp(try), shared)
	fail := func(err error) error { return &LockError{Op: op, Keys: ks, Err: err} }
	if tx == nil {
		return fail(invalid("nil tx"))
	}
	s := &c.s
	if err := s.init(ks, l.cfg.MaxKeys); err != nil {
		return fail(err)
	}
	ks = s.all
	conn := tx.Conn()
	if conn == nil {
		return fail(invalid("tx has no connection"))
	}
	if conn.IsClosed() {
		return fail(join(ErrTxAborted, errors.New("the connection of tx is closed")))
	}
	pg := conn.PgConn()
	if !l.cfg.AllowStandby && onStandby(pg) {
		return fail(ErrStandby) // the caller's connection: not ours to destroy
	}
	switch pg.TxStatus() {
	case 'E':
		return fail(fmt.Errorf("%w: roll it back", ErrTxAborted))
	case 'T':
	default: // 'I': committed, rolled back or ended by its own SQL
		return fail(invalid("tx is not in a transaction (it was committed or rolled back)"))
	}

	sp := &c.sp
	l.initSpanInTx(sp, ctx, s.all, shared, try)
	defer sp.endCut(op)
	end := func(err error) error {
		if err != nil {
			err = fail(err)
		}
		sp.acquired(err)
		return err
	}
	wctx := ctx
	if !try {
		wctx = l.waitBound(ctx, &c.bw, opts, false)
		defer c.bw.stop()
	}
	if wctx.Err() != nil {
		// Given up before anything was sent: send nothing (see waitFor).
		return end(classify(ctx, context.Cause(wctx)))
	}

	// The statement runs under a context that cannot end: a cancellation
	// becomes a cancel request and a deadline a server-side lock_timeout,
	// so that the caller's connection is kept (pgx would close it).
	w := &c.w
	w.ctx = ctx
	w.arrange(wctx, pg)
	defer w.stop()

	var b pgx.Batch
	b.Queue(sqlInTxSavepoint)
	single := len(s.all) == 1
	bounded := !try && w.bound > 0
	st := &inTxSQL[b2i(shared)]
	switch {
	case bounded:
		c.ms = boundMillis(w.bound) // capped at PostgreSQL's maximum
		b.Queue(st.bound, c.args(true)...)
	case single && try:
		sql, args := s.one(kindTryXactLock, shared, "")
		b.Queue(sql, args...)
	case single:
		sql, args := s.one(kindXactLock, shared, "")
		b.Queue(sql, args...)
	case try:
		b.Queue(st.tryAll, c.args(false)...)
	default:
		b.Queue(st.all, c.args(false)...)
	}
	b.Queue(sqlInTxRelease)

	// Read the results one by one, to know how far the server went.
	br := tx.SendBatch(w.ctx, &b)
	saved, locked, released, granted := false, false, false, true
	_, err := br.Exec()
	if err == nil {
		saved = true
		if single && try {
			err = br.QueryRow().Scan(&granted)
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			locked = true
			if _, err = br.Exec(); err == nil {
				released = true
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	w.stop()
	err = w.cut(err)
	if err == nil {
		if !granted {
			return end(join(ErrNotAcquired, ctx.Err())) // a single try took nothing
		}
		return end(nil)
	}

	busy := false
	var pgErr *pgconn.PgError
	if try && saved && !locked && !single && errors.As(err, &pgErr) && pgErr.Code == "22012" {
		busy = true // tryAll's signal: a key was busy
	}
	var undoErr error
	if saved && !released && !conn.IsClosed() {
		// Undo the call: the keys it took and the lock_timeout it set go,
		// and tx leaves the aborted savepoint.
		cctx, cancel := pooltx.CleanupContext(ctx, l.cfg.CleanupTimeout)
		_, undoErr = pg.Exec(cctx, sqlInTxUndo).ReadAll()
		cancel()
		if undoErr != nil {
			undoErr = fmt.Errorf("advisory: undo the call's savepoint: %w", undoErr)
		}
	}
	var aborted error
	if conn.IsClosed() || pg.TxStatus() != 'T' {
		aborted = ErrTxAborted
	}
	switch {
	case errors.Is(err, pgx.ErrTxClosed):
		return end(join(invalid("tx is closed"), err))
	case busy && undoErr == nil:
		return end(join(ErrNotAcquired, aborted, ctx.Err()))
	case busy:
		return end(join(ErrNotAcquired, aborted, undoErr, ctx.Err()))
	}
	return end(join(aborted, classify(ctx, err), undoErr))
}
