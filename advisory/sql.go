package advisory

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// The SQL below is built once, at init, from the fixed PostgreSQL function
// names; no input ever reaches SQL text. Keys travel as bind parameters,
// except in the single-key unlock (unlockResetSQL), which writes the key's
// integers with strconv, as pgx's simple protocol would.

// kind selects the advisory-lock function family.
type kind uint8

const (
	kindLock        kind = iota // pg_advisory_lock
	kindTryLock                 // pg_try_advisory_lock
	kindXactLock                // pg_advisory_xact_lock
	kindTryXactLock             // pg_try_advisory_xact_lock
	kindUnlock                  // pg_advisory_unlock
	numKinds
)

var funcNames = [numKinds]string{
	kindLock:        "pg_catalog.pg_advisory_lock",
	kindTryLock:     "pg_catalog.pg_try_advisory_lock",
	kindXactLock:    "pg_catalog.pg_advisory_xact_lock",
	kindTryXactLock: "pg_catalog.pg_try_advisory_xact_lock",
	kindUnlock:      "pg_catalog.pg_advisory_unlock",
}

// statements holds every statement text, indexed by kind, shared mode and
// key space, for one key and for many.
type statements struct {
	one1, one2   string // one int8 key ($1); one pair ($1, $2)
	many1, many2 string // int8[] ($1); int4[], int4[] ($1, $2), in array order
	// oneTimeout1/2: the single-key form with "SET LOCAL lock_timeout" for
	// the one implicit transaction of the statement ($2 or $3).
	oneTimeout1, oneTimeout2 string
	// manyBound1/2: the multi-key forms for a bounded wait. Before each
	// key, lock_timeout is set to what is left of the call's bound ($2 or
	// $3, in ms), measured on the server from the start of the statement's
	// transaction (now()) to clock_timestamp(), at least 1 ms: PostgreSQL
	// applies lock_timeout to each lock wait, and the bound is the whole
	// call's. A key that is free is granted even when nothing is left.
	manyBound1, manyBound2 string
}

var sqlText [numKinds][2]statements // [kind][shared]

func init() {
	for k := kind(0); k < numKinds; k++ {
		for shared := 0; shared < 2; shared++ {
			fn := funcNames[k]
			if shared == 1 {
				fn += "_shared"
			}
			// ORDER BY n with a volatile target list makes PostgreSQL take
			// the locks in array order (it evaluates volatile expressions
			// after the sort). Unlocks go in reverse order.
			order := "n"
			if k == kindUnlock {
				order = "n DESC"
			}
			sqlText[k][shared] = statements{
				one1:        fmt.Sprintf("SELECT %s($1)", fn),
				one2:        fmt.Sprintf("SELECT %s($1, $2)", fn),
				many1:       fmt.Sprintf("SELECT %s(k) FROM %s ORDER BY %s", fn, sqlInts, order),
				many2:       fmt.Sprintf("SELECT %s(a, b) FROM %s ORDER BY %s", fn, sqlPairs, order),
				oneTimeout1: fmt.Sprintf("SELECT %s($1) FROM (SELECT pg_catalog.set_config('lock_timeout', $2, true)) AS s", fn),
				oneTimeout2: fmt.Sprintf("SELECT %s($1, $2) FROM (SELECT pg_catalog.set_config('lock_timeout', $3, true)) AS s", fn),
				manyBound1:  fmt.Sprintf("SELECT pg_catalog.set_config('lock_timeout', %s, true), %s(k) FROM %s ORDER BY n", leftOf("$2"), fn, sqlInts),
				manyBound2:  fmt.Sprintf("SELECT pg_catalog.set_config('lock_timeout', %s, true), %s(a, b) FROM %s ORDER BY n", leftOf("$3"), fn, sqlPairs),
			}
		}
	}
}

// leftOf is the SQL for what is left of a bound of param milliseconds that
// began with the current transaction (now(), the database's clock), as a
// lock_timeout value of at least 1ms. The target list is evaluated per row,
// after the sort, left to right: each key's wait gets what the keys before
// it left.
func leftOf(param string) string {
	return "(greatest(1, " + param + "::pg_catalog.int8 OPERATOR(pg_catalog.-) ((extract(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) pg_catalog.now()) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8))::pg_catalog.text OPERATOR(pg_catalog.||) 'ms')"
}

const (
	// sqlSetTimeout sets lock_timeout until the end of the current
	// (implicit or explicit) transaction: SET LOCAL with a parameter.
	sqlSetTimeout = "SELECT pg_catalog.set_config('lock_timeout', $1, true)"
	// sqlRestoreTimeout follows the lock statements of a transaction-scope
	// call that set lock_timeout (sqlSetTimeout) on a connection with no
	// recorded baseline (see queueRestoreTimeout): the reset value (server,
	// database, role, connection string). It stores nothing.
	sqlRestoreTimeout = "SET LOCAL lock_timeout TO DEFAULT"
)

// queueRestoreTimeout queues, after the lock statements of a
// transaction-scope call that set lock_timeout, the statement that sets it
// back for the rest of the transaction to the session's own value, which
// pooltx recorded with the connection's baseline (before any lent code
// ran, so a SET in AfterConnect included): sqlSetTimeout with that value
// (arg holds it; a pointer: no boxing). PostgreSQL cannot read a setting's
// session value under a SET LOCAL, and SET LOCAL ... TO DEFAULT gives the
// reset value, which a session SET does not change: a callback would lose
// AfterConnect's lock_timeout. Without a baseline (none recorded yet),
// sqlRestoreTimeout.
func queueRestoreTimeout(b *pgx.Batch, c *pooltx.Conn, arg *textArg) {
	v, ok := c.SessionLockTimeout()
	if !ok {
		b.Queue(sqlRestoreTimeout)
		return
	}
	*arg = textArg(v)
	b.Queue(sqlSetTimeout, arg)
}

// keySet is a validated, sorted, de-duplicated set of keys split by key
// space, in the order the locks are taken: every int8 key, then every pair.
// A set of one key keeps it in k1 (all points there) and leaves ints, as
// and bs empty: the single-key statements take the key from all[0]. After
// init a keySet must not be modified; a copy stays valid (its all may point
// into the original's k1, which is never written again).
type keySet struct {
	all    []keys.Key
	ints   []int64
	as, bs []int32

	k1 [1]keys.Key // storage of all for one key: no allocation
	// Argument storage for one(): pointers to these fields travel as the
	// statement's arguments, which pgx encodes through their methods
	// (pgtype.Int64Valuer, pgtype.TextValuer), so that the call allocates
	// neither an []any nor a boxed int64, and pgx needs no reflection to
	// reach the value (a plain *int64 it dereferences with reflect, boxing
	// the int64 again).
	argv   [3]any
	v      int8Arg
	a, b   int4Arg
	tmoArg textArg
}

// int8Arg, int4Arg and textArg are statement arguments passed by pointer
// (keySet.one). Under the extended protocol with a described statement
// (pgx's default), pgx's codecs for int8, int4 and text take them by these
// methods; where pgx knows no parameter type (QueryExecModeExec, the
// simple protocol) it finds the underlying int64, int32 or string.
type (
	int8Arg int64
	int4Arg int32
	textArg string
)

func (a *int8Arg) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*a), Valid: true}, nil
}

func (a *int4Arg) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*a), Valid: true}, nil
}

func (a *textArg) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*a), Valid: true}, nil
}

// String methods: a pgx tracer that logs the arguments (tracelog) prints
// the values, not the pointers.
func (a *int8Arg) String() string { return strconv.FormatInt(int64(*a), 10) }
func (a *int4Arg) String() string { return strconv.FormatInt(int64(*a), 10) }
func (a *textArg) String() string { return string(*a) }

func newKeySet(ks []keys.Key, max int) (keySet, error) {
	var s keySet
	err := s.init(ks, max)
	return s, err
}

// init validates ks and fills s in place (see keySet).
func (s *keySet) init(ks []keys.Key, max int) error {
	if len(ks) == 0 {
		return invalid("no keys")
	}
	for i, k := range ks {
		if k.IsZero() {
			return invalid("keys[%d] is the zero keys.Key (no key was set; the value 0 is keys.Int64(0))", i)
		}
	}
	if len(ks) == 1 {
		s.k1[0] = ks[0]
		s.all = s.k1[:]
		return nil
	}
	all := keys.Normalize(ks)
	if len(all) > max {
		return invalid("%d keys in one call, more than the cap of %d (Config.MaxKeys)", len(all), max)
	}
	s.all = all
	for _, k := range all {
		if v, ok := k.Int64(); ok {
			s.ints = append(s.ints, v)
		} else if a, b, ok := k.Pair(); ok {
			s.as = append(s.as, a)
			s.bs = append(s.bs, b)
		}
	}
	return nil
}

// one returns the statement and arguments that apply kind to the single
// key of s (len(s.all) == 1), with the timeout in the statement when set.
// The arguments point into s: they are valid until the next call of one.
func (s *keySet) one(k kind, shared bool, timeout string) (string, []any) {
	st := &sqlText[k][b2i(shared)]
	s.tmoArg = textArg(timeout)
	if v, ok := s.all[0].Int64(); ok {
		s.v = int8Arg(v)
		s.argv[0] = &s.v
		if timeout != "" {
			s.argv[1] = &s.tmoArg
			return st.oneTimeout1, s.argv[:2]
		}
		return st.one1, s.argv[:1]
	}
	a, b, _ := s.all[0].Pair()
	s.a, s.b = int4Arg(a), int4Arg(b)
	s.argv[0], s.argv[1] = &s.a, &s.b
	if timeout != "" {
		s.argv[2] = &s.tmoArg
		return st.oneTimeout2, s.argv[:3]
	}
	return st.one2, s.argv[:2]
}

// unlockResetSQL returns the simple-protocol string that unlocks the keys
// of s in the given mode and then resets the session of c
// (pooltx.Conn.AppendReset): one round trip, 1+c.ResetCount() results.
// The first answers, for one key, the unlock's boolean, and for several,
// how many unlocks answered false (pairs released first, then int8 keys,
// as queue does). Keys are written as numeric literals (strconv, never
// input text), as pgx's own simple protocol would render them. Being a
// string of its own, it does not depend on pgx's statement cache, which
// lent code may have emptied on the server (DEALLOCATE ALL, DISCARD ALL):
// the several-key unlock, a pipeline of cached statements, falls back to
// it then.
func (s *keySet) unlockResetSQL(c *pooltx.Conn, shared bool) string {
	if len(s.all) > 1 {
		return s.unlockManyResetSQL(c, shared)
	}
	var buf [256]byte
	b := append(buf[:0], "SELECT "...)
	b = append(b, funcNames[kindUnlock]...)
	if shared {
		b = append(b, "_shared"...)
	}
	b = append(b, '(')
	if v, ok := s.all[0].Int64(); ok {
		b = strconv.AppendInt(b, v, 10)
	} else {
		x, y, _ := s.all[0].Pair()
		b = strconv.AppendInt(b, int64(x), 10)
		b = append(b, ", "...)
		b = strconv.AppendInt(b, int64(y), 10)
	}
	b = append(b, "); "...)
	b = c.AppendReset(b)
	return string(b)
}

// unlockManyResetSQL is unlockResetSQL for several keys: one SELECT of
// the number of false unlocks, over VALUES lists (no cap on their length,
// as a target list of one unlock per key would have).
func (s *keySet) unlockManyResetSQL(c *pooltx.Conn, shared bool) string {
	fn := funcNames[kindUnlock]
	if shared {
		fn += "_shared"
	}
	b := make([]byte, 0, 160+24*len(s.all)+512) // the reset: about 200 bytes, more with restored settings
	b = append(b, "SELECT 0"...)
	if len(s.as) > 0 {
		b = append(b, " OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM (VALUES "...)
		for i := range s.as {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '(')
			b = strconv.AppendInt(b, int64(s.as[i]), 10)
			b = append(b, ", "...)
			b = strconv.AppendInt(b, int64(s.bs[i]), 10)
			b = append(b, ')')
		}
		b = append(b, ") AS v(a, b) WHERE NOT "...)
		b = append(b, fn...)
		b = append(b, "(v.a, v.b))"...)
	}
	if len(s.ints) > 0 {
		b = append(b, " OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM (VALUES "...)
		for i, v := range s.ints {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, "(("...)
			b = strconv.AppendInt(b, v, 10)
			b = append(b, ")::pg_catalog.int8)"...)
		}
		b = append(b, ") AS v(k) WHERE NOT "...)
		b = append(b, fn...)
		b = append(b, "(v.k))"...)
	}
	b = append(b, "; "...)
	b = c.AppendReset(b)
	return string(b)
}

// queue adds the statements that apply kind to every key of s to b, in lock
// order. bound, when positive, bounds the wait of the whole set: for one key
// it rides in the lock statement as lock_timeout; for several, each key's
// wait gets what is left of it (manyBound). check, when not nil, reads each
// statement's rows (one bool per key); without it the results are only
// checked for errors, which is cheaper.
func (s *keySet) queue(b *pgx.Batch, k kind, shared bool, bound time.Duration, check func(pgx.Rows) error) {
	add := func(sql string, args ...any) {
		q := b.Queue(sql, args...)
		if check != nil {
			q.Query(check)
		}
	}
	if len(s.all) == 1 {
		timeout := ""
		if bound > 0 {
			timeout = formatTimeout(bound)
		}
		sql, args := s.one(k, shared, timeout)
		add(sql, args...)
		return
	}
	st := &sqlText[k][b2i(shared)]
	ints, as, bs := s.ints, s.as, s.bs
	if k == kindUnlock { // release in reverse order: pairs first, then int8 keys
		if len(as) > 0 {
			add(st.many2, as, bs)
		}
		if len(ints) > 0 {
			add(st.many1, ints)
		}
		return
	}
	if bound > 0 {
		ms := boundMillis(bound)
		if len(ints) > 0 {
			add(st.manyBound1, ints, ms)
		}
		if len(as) > 0 {
			add(st.manyBound2, as, bs, ms)
		}
		return
	}
	if len(ints) > 0 {
		add(st.many1, ints)
	}
	if len(as) > 0 {
		add(st.many2, as, bs)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// formatTimeout renders d as a lock_timeout value in whole milliseconds,
// at least 1 ms (0 would mean "wait for ever").
func formatTimeout(d time.Duration) string {
	return strconv.FormatInt(boundMillis(d), 10) + "ms"
}

// maxLockTimeoutMillis is the largest lock_timeout PostgreSQL accepts
// (INT_MAX ms, about 24.8 days); a larger value fails the statement with
// 22023, and 0 would mean no timeout at all.
const maxLockTimeoutMillis = 1<<31 - 1

// boundMillis is d in whole milliseconds, rounded up, at least 1 and at
// most maxLockTimeoutMillis: a bound longer than PostgreSQL's maximum is
// cut to it.
func boundMillis(d time.Duration) int64 {
	if d >= maxLockTimeoutMillis*time.Millisecond {
		return maxLockTimeoutMillis
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms < 1 {
		ms = 1
	}
	return int64(ms)
}

// The key lists of the multi-key statements, in array order: n, the
// position, orders the locks.
const (
	sqlInts  = "ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[])) WITH ORDINALITY AS u(k, n)"
	sqlPairs = "ROWS FROM (pg_catalog.unnest($1::pg_catalog.int4[]), pg_catalog.unnest($2::pg_catalog.int4[])) WITH ORDINALITY AS u(a, b, n)"
)
