package main

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
)

// styledDSN is the test database's DSN in pgx's exec mode (results as text) with
// DateStyle 'SQL, DMY', which pgx cannot parse timestamps in.
func styledDSN(t *testing.T) string {
	dsn := pgtest.DSN(t)
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "default_query_exec_mode=exec&options=" + strings.ReplaceAll(url.QueryEscape("-c DateStyle=SQL,DMY"), "+", "%20")
	}
	return dsn + " default_query_exec_mode=exec options='-c DateStyle=SQL,DMY'"
}

// `pgxlock leases` and `pgxlock locks` read the server's times whatever the session's
// DateStyle, in the exec mode too. Before, both failed reading the server clock (and
// leases its own acquired_at).
func TestCLIReadsTimesUnderAnotherDateStyle(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctxT(t)))
	l, err := m.TryAcquire(ctxT(t), "r", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(ctxT(t)) })
	key := keys.Int64(pgtest.UniqueInt64(t))
	hold(t, pool, key)
	env := []string{"DATABASE_URL=" + styledDSN(t)}

	code, out, stderr := runCLI(t, env, "leases", "--table", schema+"."+lease.DefaultTable, "--json")
	require.Equal(t, 0, code, stderr)
	var doc leasesJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc.Leases, 1, out)
	assert.WithinDuration(t, time.Now(), doc.At, time.Minute, "the server clock, read")

	code, out, stderr = runCLI(t, env, "locks", "--json")
	require.Equal(t, 0, code, stderr)
	require.Len(t, locksOn(parseLocksJSON(t, out), key), 1, out)
}
