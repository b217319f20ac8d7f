package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/examples/internal/extest"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Four copies of the built binary start at once on one database: every migration is
// applied exactly once, by one copy; the others wait and find nothing to do; all exit 0.
func TestFourProcessesApplyEachMigrationOnce(t *testing.T) {
	bin := extest.Build(t)
	url := extest.DatabaseURL(t)

	const n = 4
	procs := make([]*extest.Proc, n)
	for i := range procs {
		name := fmt.Sprintf("m%d", i+1)
		procs[i] = extest.Start(t, name, bin, []string{exampledb.EnvURL + "=" + url}, "--procs=1", "--name="+name)
	}
	appliers, idle := 0, 0
	for _, p := range procs {
		require.Equal(t, 0, p.Wait(t, 20*time.Second), "%s exit code", p.Name)
		out := strings.Join(p.Lines(), "\n")
		if strings.Contains(out, "] applied ") {
			appliers++
		}
		if strings.Contains(out, "nothing to do") {
			idle++
		}
	}
	// The lock covers the whole set, so one copy applies everything.
	assert.Equal(t, 1, appliers, "copies that applied migrations")
	assert.Equal(t, n-1, idle, "copies that found nothing to do")
	checkApplied(t, url)
}

// The default mode (--procs=4) launches the copies itself.
func TestLauncher(t *testing.T) {
	bin := extest.Build(t)
	url := extest.DatabaseURL(t)
	p := extest.Start(t, "launcher", bin, []string{exampledb.EnvURL + "=" + url})
	require.Equal(t, 0, p.Wait(t, 20*time.Second))
	p.WaitLine(t, 0, "all 4 copies exited cleanly", time.Second)
	checkApplied(t, url)
}

// A second run against a migrated database applies nothing.
func TestRerunIsNoop(t *testing.T) {
	url := extest.DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var first, second strings.Builder
	require.NoError(t, migrate(ctx, url, "first", &first))
	require.NoError(t, migrate(ctx, url, "second", &second))
	assert.Contains(t, first.String(), "applied 003_add_accounts_plan")
	assert.Contains(t, second.String(), "nothing to do: all 3 migrations already applied")
	assert.NotContains(t, second.String(), "] applied ")
	checkApplied(t, url)
}

// checkApplied: schema_migrations lists each embedded migration exactly once, and the
// schema they build is there.
func checkApplied(t *testing.T, url string) {
	t.Helper()
	conn := extest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, `SELECT version, count(*) FROM pgxlock_example_migrate.schema_migrations GROUP BY version ORDER BY version`)
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var v string
		var c int
		require.NoError(t, rows.Scan(&v, &c))
		got[v] = c
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, map[string]int{"001_create_accounts": 1, "002_seed_accounts": 1, "003_add_accounts_plan": 1}, got)

	var accounts int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pgxlock_example_migrate.accounts WHERE plan = 'free'`).Scan(&accounts))
	assert.Equal(t, 50000, accounts)
}
