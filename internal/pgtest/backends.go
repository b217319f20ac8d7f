package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AwaitBackendGone waits (bounded: a minute) until the backend pid has
// left pg_stat_activity as pool sees it: the server ended its session.
func AwaitBackendGone(ctx context.Context, t testing.TB, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n); err != nil {
			t.Fatalf("pgtest: look for backend %d: %v", pid, err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: backend %d still there after a minute", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
