package advisory

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/keys"
)

// The SQL below is built once, at init, from the fixed PostgreSQL function
// names; no input ever reaches SQL text. Keys travel as bind parameters.

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
	kindLock:        "pg_advisory_lock",
	kindTryLock:     "pg_try_advisory_lock",
	kindXactLock:    "pg_advisory_xact_lock",
	kindTryXactLock: "pg_try_advisory_xact_lock",
	kindUnlock:      "pg_advisory_unlock",
}

// statements holds every statement text, indexed by kind, shared mode and
// key space, for one key and for many.
type statements struct {
	one1, one2   string // one int8 key ($1); one pair ($1, $2)
	many1, many2 string // int8[] ($1); int4[], int4[] ($1, $2), in array order
	// oneTimeout1/2: the single-key form with "SET LOCAL lock_timeout" for
	// the one implicit transaction of the statement ($2 or $3).
	oneTimeout1, oneTimeout2 string
	// oneAll1/2 (unlock only): unlock one key, then drop any other
	// session-level advisory lock of the session, in one statement (the
	// target list is evaluated left to right).
	oneAll1, oneAll2 string
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
				many1:       fmt.Sprintf("SELECT %s(k) FROM unnest($1::int8[]) WITH ORDINALITY AS u(k, n) ORDER BY %s", fn, order),
				many2:       fmt.Sprintf("SELECT %s(a, b) FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS u(a, b, n) ORDER BY %s", fn, order),
				oneTimeout1: fmt.Sprintf("SELECT %s($1) FROM (SELECT set_config('lock_timeout', $2, true)) AS s", fn),
				oneTimeout2: fmt.Sprintf("SELECT %s($1, $2) FROM (SELECT set_config('lock_timeout', $3, true)) AS s", fn),
				oneAll1:     fmt.Sprintf("SELECT %s($1), pg_advisory_unlock_all()", fn),
				oneAll2:     fmt.Sprintf("SELECT %s($1, $2), pg_advisory_unlock_all()", fn),
			}
		}
	}
}

const (
	// sqlSetTimeout sets lock_timeout until the end of the current
	// (implicit or explicit) transaction: SET LOCAL with a parameter.
	sqlSetTimeout = "SELECT set_config('lock_timeout', $1, true)"
	// sqlSaveTimeout and sqlRestoreTimeout bracket the lock statements of
	// a transaction-scope call so that the callback runs with the
	// lock_timeout it would have had without us. The saved value lives in
	// a transaction-local placeholder setting.
	sqlSaveTimeout    = "SELECT set_config('pgxlock.saved_lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', $1, true)"
	sqlRestoreTimeout = "SELECT set_config('lock_timeout', current_setting('pgxlock.saved_lock_timeout'), true)"
	// sqlUnlockAll drops every session-level advisory lock of the session.
	sqlUnlockAll = "SELECT pg_advisory_unlock_all()"
)

// keySet is a validated, sorted, de-duplicated set of keys split by key
// space, in the order the locks are taken: every int8 key, then every pair.
type keySet struct {
	all    []keys.Key
	ints   []int64
	as, bs []int32
}

func newKeySet(ks []keys.Key, max int) (keySet, error) {
	if len(ks) == 0 {
		return keySet{}, invalid("no keys")
	}
	for i, k := range ks {
		if k.IsZero() {
			return keySet{}, invalid("keys[%d] is the zero keys.Key (no key was set; the value 0 is keys.Int64(0))", i)
		}
	}
	all := keys.Normalize(ks)
	if len(all) > max {
		return keySet{}, invalid("%d keys in one call, more than the cap of %d (Config.MaxKeys)", len(all), max)
	}
	s := keySet{all: all}
	for _, k := range all {
		if v, ok := k.Int64(); ok {
			s.ints = append(s.ints, v)
		} else if a, b, ok := k.Pair(); ok {
			s.as = append(s.as, a)
			s.bs = append(s.bs, b)
		}
	}
	return s, nil
}

// one returns the statement and arguments that apply kind to the single
// key of s (len(s.all) == 1), with the timeout in the statement when set.
// For kindUnlock it is the unlock-then-unlock-all statement.
func (s *keySet) one(k kind, shared bool, timeout string) (string, []any) {
	st := &sqlText[k][b2i(shared)]
	if v, ok := s.all[0].Int64(); ok {
		switch {
		case k == kindUnlock:
			return st.oneAll1, []any{v}
		case timeout != "":
			return st.oneTimeout1, []any{v, timeout}
		}
		return st.one1, []any{v}
	}
	a, b, _ := s.all[0].Pair()
	switch {
	case k == kindUnlock:
		return st.oneAll2, []any{a, b}
	case timeout != "":
		return st.oneTimeout2, []any{a, b, timeout}
	}
	return st.one2, []any{a, b}
}

// queue adds the statements that apply kind to every key of s to b, in lock
// order. When timeout is non-empty and the whole set is one key, the
// timeout rides in the lock statement itself; otherwise the caller queues
// sqlSetTimeout first. check, when not nil, reads each statement's rows
// (one bool per key); without it the results are only checked for errors,
// which is cheaper.
func (s *keySet) queue(b *pgx.Batch, k kind, shared bool, timeout string, check func(pgx.Rows) error) {
	add := func(sql string, args ...any) {
		q := b.Queue(sql, args...)
		if check != nil {
			q.Query(check)
		}
	}
	if len(s.all) == 1 {
		sql, args := s.one(k, shared, timeout)
		if k == kindUnlock {
			sql = sqlText[k][b2i(shared)].one1
			if _, ok := s.all[0].Int64(); !ok {
				sql = sqlText[k][b2i(shared)].one2
			}
		}
		add(sql, args...)
		return
	}
	st := &sqlText[k][b2i(shared)]
	if timeout != "" {
		b.Queue(sqlSetTimeout, timeout)
	}
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
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(int64(ms), 10) + "ms"
}
