// Package advisory_test holds black-box fault tests of package advisory against a real
// PostgreSQL: a terminated holder, a server restart, a network cut, random cancellation,
// OS processes killed mid-hold or mid-wait, PgBouncer in transaction pooling mode, and a
// failover to a promoted standby.
//
// Latencies (loss detection, waiter hand-over) are logged with t.Logf; see them with
//
//	go test -race -count=1 -v -run 'Terminate|Restart|NetCut|EventDriven|Process' ./advisory_test/
package advisory_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitBound bounds every wait for a state in these tests.
const waitBound = 20 * time.Second

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newLocker(t testing.TB, pool *pgxpool.Pool, cfg advisory.Config) *advisory.Locker {
	t.Helper()
	l, err := advisory.New(pool, cfg)
	require.NoError(t, err)
	return l
}

func int64Key(t testing.TB) keys.Key { return keys.Int64(pgtest.UniqueInt64(t)) }

func pairKey(t testing.TB) keys.Key {
	return keys.Pair(pgtest.UniqueInt32(t), pgtest.UniqueInt32(t))
}

// awaitLocks polls the advisory locks on ks (through q, another session) until cond
// accepts them, and returns them; it fails the test after waitBound, showing the last
// state seen. Polling a database state is how these tests synchronise with sessions they
// do not control.
func awaitLocks(t testing.TB, ctx context.Context, q advisory.Querier, what string, cond func([]advisory.LockInfo) bool, ks ...keys.Key) []advisory.LockInfo {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		locks, err := advisory.ListLocks(ctx, q, ks...)
		require.NoError(t, err)
		if cond(locks) {
			return locks
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; advisory locks on %v now:\n%s", waitBound, what, ks, formatLocks(locks))
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// holderPIDs waits until every key of ks is held (granted) and returns the holding
// backends, one per key.
func holderPIDs(t testing.TB, ctx context.Context, q advisory.Querier, ks ...keys.Key) map[keys.Key]int32 {
	t.Helper()
	locks := awaitLocks(t, ctx, q, "the keys to be held", func(ls []advisory.LockInfo) bool {
		return len(granted(ls)) == len(ks)
	}, ks...)
	return granted(locks)
}

func granted(ls []advisory.LockInfo) map[keys.Key]int32 {
	out := map[keys.Key]int32{}
	for _, l := range ls {
		if l.Granted {
			out[l.Key] = l.PID
		}
	}
	return out
}

// waiters counts the sessions waiting for any of the listed locks.
func waiters(ls []advisory.LockInfo) int {
	n := 0
	for _, l := range ls {
		if !l.Granted {
			n++
		}
	}
	return n
}

func formatLocks(ls []advisory.LockInfo) string {
	if len(ls) == 0 {
		return "  (none)"
	}
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "  %v pid %d granted=%v shared=%v app=%q state=%q blocked by %v\n",
			l.Key, l.PID, l.Granted, l.Shared, l.ApplicationName, l.State, l.BlockedBy)
	}
	return b.String()
}

// terminate ends a backend with pg_terminate_backend through q and returns when the
// server has accepted the request (it signals the backend; the backend exits just after).
func terminate(t testing.TB, ctx context.Context, q *pgxpool.Pool, pid int32) {
	t.Helper()
	var ok bool
	require.NoError(t, q.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok, "pg_terminate_backend(%d) found no such backend", pid)
}

// await receives from ch within waitBound, failing the test otherwise.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatalf("waited %v for %s", waitBound, what)
		panic("unreachable")
	}
}

// latencies summarises durations for logs: min / median / max.
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %v, median %v, max %v (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}
