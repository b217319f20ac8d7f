package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// `leases` lists live and expired leases of a lock-manager table.
func TestLeasesListsLiveAndExpired(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute, Owner: "test-owner"})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctxT(t)))

	live, err := m.TryAcquire(ctxT(t), "jobs/nightly report", &lease.AcquireOptions{Metadata: json.RawMessage(`{"host":"a"}`)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = live.Release(ctxT(t)) })
	_, err = m.TryAcquire(ctxT(t), "jobs/expired", &lease.AcquireOptions{TTL: lease.MinTTL, Mode: lease.Shared})
	require.NoError(t, err)
	waitFor(t, waitTimeout, "the short lease to expire", func() bool {
		hs, err := m.List(ctxT(t), &lease.ListOptions{Resource: "jobs/expired", IncludeExpired: true})
		require.NoError(t, err)
		return len(hs) == 1 && hs[0].Expired
	})

	table := schema + "." + lease.DefaultTable
	code, out, stderr := runCLI(t, nil, "leases", "--table", table, "--json")
	require.Equal(t, 0, code, stderr)
	var doc leasesJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.Equal(t, table, doc.Table)
	require.Len(t, doc.Leases, 2, out)
	byRes := map[string]leaseJSON{}
	for _, l := range doc.Leases {
		byRes[l.Resource] = l
	}
	l := byRes["jobs/nightly report"]
	assert.False(t, l.Expired)
	assert.Equal(t, "exclusive", l.Mode)
	assert.Equal(t, "test-owner", l.Owner)
	assert.Equal(t, live.Token(), l.Token)
	require.NotNil(t, l.ExpiresInSeconds)
	assert.Greater(t, *l.ExpiresInSeconds, 0.0)
	assert.JSONEq(t, `{"host":"a"}`, string(l.Metadata))
	x := byRes["jobs/expired"]
	assert.True(t, x.Expired)
	assert.Equal(t, "shared", x.Mode)
	require.NotNil(t, x.ExpiresInSeconds)
	assert.LessOrEqual(t, *x.ExpiresInSeconds, 0.0)
	assert.Equal(t, "null", string(x.Metadata))

	code, out, stderr = runCLI(t, nil, "leases", "--table", table)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "RESOURCE")
	assert.Regexp(t, `"jobs/nightly report"\s+exclusive\s+live\s`, out)
	assert.Regexp(t, `jobs/expired\s+shared\s+expired\s`, out)

	code, out, stderr = runCLI(t, nil, "leases", "--table", table, "--resource", "jobs/expired")
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "nightly")
}

func TestLeasesMissingTable(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	code, _, stderr := runCLI(t, nil, "leases", "--table", schema+".nosuch")
	assert.Equal(t, exitUnavailable, code)
	assert.True(t, strings.Contains(stderr, "lease.Manager.Migrate"), stderr)
}

// A table that exists but is not a lease table is named as such, not reported as a
// missing column.
func TestLeasesNotALeaseTable(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	_, err := pool.Exec(ctxT(t), "CREATE TABLE "+pgx.Identifier{schema, "accounts"}.Sanitize()+" (id int PRIMARY KEY, name text)")
	require.NoError(t, err)
	code, _, stderr := runCLI(t, nil, "leases", "--table", schema+".accounts")
	assert.Equal(t, exitUnavailable, code)
	assert.Contains(t, stderr, `"`+schema+`.accounts" is not a pgxlock lease table`)
}

// `leases` shows writers waiting for a resource: while one waits, new
// readers are refused although no exclusive holder is listed.
func TestLeasesShowsWaitingWriters(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute, PollInterval: time.Hour})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctxT(t)))
	reader, err := m.TryAcquire(ctxT(t), "doc", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Release(ctxT(t)) })
	wctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = m.Acquire(wctx, "doc", nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, waitTimeout, "the writer's intent", func() bool {
		in, err := m.ListIntents(ctxT(t), nil)
		require.NoError(t, err)
		return len(in) == 1
	})

	table := schema + "." + lease.DefaultTable
	code, out, stderr := runCLI(t, nil, "leases", "--table", table, "--json")
	require.Equal(t, 0, code, stderr)
	var doc leasesJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc.Intents, 1, out)
	assert.Equal(t, "doc", doc.Intents[0].Resource)
	assert.False(t, doc.Intents[0].Expired)
	require.NotNil(t, doc.Intents[0].UntilInSeconds)
	assert.Greater(t, *doc.Intents[0].UntilInSeconds, 0.0)

	code, out, stderr = runCLI(t, nil, "leases", "--table", table)
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `WAITING WRITER FOR\s+STATE`, out)
	assert.Regexp(t, `doc\s+waiting\s+in `, out)
}

// Review round 13: a lease row edited by hand to expires_at = 'infinity' (a
// lease pinned for good) made `leases` fail for the whole table (0A000: the
// epoch cast), and would then have failed in --json (encoding/json refuses
// years beyond 9999). It lists as documented: "never" and "infinity", a null
// expires_in_seconds; a year beyond 9999 with more digits.
func TestLeasesShowsInfiniteTimes(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctxT(t)))
	for _, r := range []string{"pinned", "far", "gone"} {
		_, err := m.TryAcquire(ctxT(t), r, nil)
		require.NoError(t, err)
	}
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	for r, at := range map[string]string{"pinned": "infinity", "far": "20000-01-01 00:00:00+00", "gone": "-infinity"} {
		_, err := pool.Exec(ctxT(t), "UPDATE "+holders+" SET expires_at = $2::timestamptz WHERE resource = $1", r, at)
		require.NoError(t, err)
	}
	table := schema + "." + lease.DefaultTable
	code, out, stderr := runCLI(t, nil, "leases", "--table", table, "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, `"expires_at":"infinity"`)
	assert.Contains(t, out, `"expires_at":"-infinity"`)
	assert.Contains(t, out, `"expires_at":"20000-01-01T00:00:00Z"`)
	var doc struct {
		Leases []struct {
			Resource string   `json:"resource"`
			In       *float64 `json:"expires_in_seconds"`
			Expired  bool     `json:"expired"`
		} `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc.Leases, 3)
	for _, l := range doc.Leases {
		switch l.Resource {
		case "pinned", "gone":
			assert.Nil(t, l.In, l.Resource)
			assert.Equal(t, l.Resource == "gone", l.Expired, l.Resource)
		case "far":
			require.NotNil(t, l.In)
			assert.Greater(t, *l.In, 5e11, "about 18,000 years, beyond a Duration's 292 (review round 14)")
		}
	}
	code, out, stderr = runCLI(t, nil, "leases", "--table", table)
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `pinned\s+exclusive\s+live\s.*never`, out)
	assert.Regexp(t, `gone\s+exclusive\s+expired\s.*-infinity`, out)
	assert.Regexp(t, `far\s+exclusive\s+live\s.*in 179[0-9]{2}y`, out, "years, not a Duration's saturated 106751d")
}
