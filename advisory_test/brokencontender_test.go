package advisory_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// The checker can fail: a deliberately broken contender, raw pgx taking a session lock
// through the pool without pinning a connection (the lock stays on a connection that
// goes back to the pool), run against PostgreSQL. With one connection in the pool the
// second caller draws the locked connection, and since advisory locks are re-entrant
// in their session its lock call succeeds at once: two holders. porcupine rejects the
// history, and Check's visualisation is written.
func TestCheckerRejectsUnpinnedSessionLock(t *testing.T) {
	ctx := testCtx(t)
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	pool := pgtest.NewPool(t, cfg)
	k := pgtest.UniqueInt64(t)
	key := fmt.Sprint(k)
	rec := history.NewRecorder("test", nil)

	// lock and unlock are the broken contender: each borrows whatever connection the
	// pool hands out for one statement.
	lock := func(client string) {
		p := rec.Begin(history.Op{Client: client, Key: key, Kind: history.Acquire})
		_, err := pool.Exec(ctx, "SELECT pg_advisory_lock($1)", k)
		require.NoError(t, err)
		p.End(history.OK, 0)
	}
	unlock := func(client string) {
		p := rec.Begin(history.Op{Client: client, Key: key, Kind: history.Release})
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", k).Scan(&ok))
		require.True(t, ok, "the unlock found the lock held by its session")
		p.End(history.OK, 0)
	}
	// The interleaving is forced by the order of the calls: A holds, B "acquires",
	// then both release.
	lock("A")
	lock("B")
	unlock("A")
	unlock("B")

	v := history.Run(history.LockModel(), rec.Ops(), history.CheckTimeout)
	t.Logf("broken contender: %v", v)
	assert.Equal(t, porcupine.Illegal, v.Result)
	path, err := history.SaveHTML(t, v)
	require.NoError(t, err)
	html, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(html), "<html"), "not porcupine's visualisation: %s", path)
	t.Logf("visualisation: %s", path)
	if dir := filepath.Dir(path); strings.HasPrefix(filepath.Base(dir), "pgxlock-history-") {
		require.NoError(t, os.RemoveAll(dir)) // not a kept artifact: this failure was expected
	}
	pgtest.AssertNoAdvisoryLocks(t, pool)
}
