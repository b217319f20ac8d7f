package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
)

// badSettingsLeak runs locks, leases and run with env and checks that each
// exits 64, masks with xxxxx and shows none of secrets, in the masked
// settings or in the parser's reason.
func badSettingsLeak(t *testing.T, env []string, secrets ...string) {
	t.Helper()
	for _, args := range [][]string{{"locks"}, {"leases"}, {"run", "--key", "1", "--", "echo", "ran"}} {
		code, out, errOut := runInProcess(t, env, args...)
		assert.Equal(t, exitUsage, code, "%v %v: %s", env, args, errOut)
		assert.Contains(t, errOut, "cannot parse the connection settings", "%v %v", env, args)
		assert.Contains(t, errOut, "xxxxx", "%v %v", env, args)
		for _, s := range secrets {
			assert.NotContains(t, errOut, s, "%v %v", env, args)
		}
		assert.NotContains(t, out, "ran")
	}
}

// Review round 25 (F-1): a key=value password with an unescaped quote in a
// quoted value ends, for the parser, at that quote; the rest of it was shown
// both in the masked settings and in the parser's reason (missing "=" after
// "..."). Whatever follows a password that did not parse cleanly is masked.
func TestBadKVSettingsHidePasswordTail(t *testing.T) {
	for _, tc := range []struct {
		cs      string
		secrets []string
	}{
		{"host=127.0.0.1 user=fixd_u password='it's-S3cret' port=5432", []string{"S3cret", "s-S3"}},
		{"host=127.0.0.1 user=fixd_u password='S3c'retPW port=5432", []string{"S3c", "retPW"}},
		{"host=127.0.0.1 password='it' s-S3cret' port=5432", []string{"S3cret"}},
		{"host=127.0.0.1 password='it' s=S3cret' port=5432 sslmode=bogus", []string{"S3cret"}},
		{"host=127.0.0.1 password=abc S3cret port=5432", []string{"S3cret"}},
		{"host=127.0.0.1 password='unterminated S3cret port=5432", []string{"S3cret", "unterminated"}},
		{"host='127.0.0.1 password=S3cret", []string{"S3cret"}}, // the string goes wrong before the password
	} {
		badSettingsLeak(t, []string{"DATABASE_URL=" + tc.cs}, tc.secrets...)
	}
	// What parses cleanly keeps its reason and the settings after it.
	code, _, errOut := runInProcess(t, []string{`DATABASE_URL=host=127.0.0.1 password='it\'s-S3cret' sslmode=bogus`}, "locks")
	assert.Equal(t, exitUsage, code, errOut)
	assert.Contains(t, errOut, "password=xxxxx sslmode=bogus")
	assert.Contains(t, errOut, "sslmode is invalid")
	assert.NotContains(t, errOut, "S3cret")
	// PGPASSWORD with quotes and backslashes is escaped by pgxlock itself.
	badSettingsLeak(t, []string{"PGHOST=127.0.0.1", `PGPASSWORD=it's-S3c\ret'`, "PGSSLMODE=bogus"}, "S3c", "ret")
}

// Review round 25 (F-2): in a URL's query a password runs to the next &
// (# and ; are part of it, for pgx as for libpq); the tail after a ; or #
// was shown.
func TestBadURLSettingsHidePasswordTail(t *testing.T) {
	for _, tc := range []struct {
		cs      string
		secrets []string
	}{
		{"postgres://fixd_u@127.0.0.1/db?password=S3c;retPW&sslmode=bogus", []string{"retPW", "S3c"}},
		{"postgres://fixd_u@127.0.0.1/db?sslmode=bogus&password=S3c#retPW", []string{"retPW", "S3c"}},
		{"postgres://fixd_u@127.0.0.1/db?sslmode=bogus&password=S3c#retPW&sslmode=bogus", []string{"retPW", "S3c"}},
		{"postgres://fixd_u@127.0.0.1/db?password=S3c&retPW&sslmode=bogus", []string{"retPW", "S3c"}},
		{"postgres://fixd_u@127.0.0.1/db?password=S3c&retPW=x&sslmode=bogus", []string{"retPW", "S3c"}},
		{"postgres://fixd_u@127.0.0.1/db?p%61ssword=S3cretPW&sslmode=bogus", []string{"S3cretPW"}},
		{"postgres://127.0.0.1:5432/db?password=S3c@retPW&sslmode=bogus", []string{"retPW", "S3c"}},
		{"postgres://fixd_u:S3c#ret;PW@127.0.0.1/db?sslmode=bogus", []string{"ret", "S3c"}},
	} {
		badSettingsLeak(t, []string{"DATABASE_URL=" + tc.cs}, tc.secrets...)
	}
	code, _, errOut := runInProcess(t, []string{"DATABASE_URL=postgres://u@127.0.0.1/db?password=S3c;ret#PW&sslmode=bogus"}, "locks")
	assert.Equal(t, exitUsage, code, errOut)
	assert.Contains(t, errOut, "?password=xxxxx&sslmode=bogus")
	assert.Contains(t, errOut, "sslmode is invalid")
}

// Review round 25 (F-3): C1 control characters (U+0080..U+009F: CSI, NEL)
// in server-supplied text reached the terminal raw; bytes that are not
// UTF-8 too.
func TestOutputFiltersC1AndInvalidUTF8(t *testing.T) {
	const c1 = "\u009b2J\u0085x"
	// Table cells, and pgxlock's own messages.
	assert.Equal(t, "a 2J x b", cell("a"+c1+" b", 0))
	assert.Equal(t, `a\xff b`, cell("a\xff\u0085b", 0))
	assert.Equal(t, `"o\u009b2J\u0085x"`, quoteCell("o"+c1, 40))
	assert.Equal(t, `"o\xffz"`, quoteCell("o\xffz", 40))
	assert.Equal(t, "line\n\\u009b2J\\u0085x \\x1b[2J \\xff\tend", safeText("line\n"+c1+" \x1b[2J \xff\tend"))
	assert.Equal(t, `{"q":"\u009b\ufffd"}`, string(jsonControlSafe([]byte("{\"q\":\"\u009b\xff\"}"))))

	// locks --show-query: the holder's last query carries C1 controls.
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	query := holdWithQuery(t, pool, key, c1)
	noC1 := func(what, s string) {
		t.Helper()
		assert.NotContains(t, s, "\u009b", what)
		assert.NotContains(t, s, "\u0085", what)
	}
	code, out, stderr := runCLI(t, nil, "locks", "--show-query", "--key", key.String())
	require.Equal(t, 0, code, stderr)
	noC1("locks text", out)
	assert.Contains(t, out, "/* 2J x */")
	code, out, stderr = runCLI(t, nil, "locks", "--show-query", "--json", "--key", key.String())
	require.Equal(t, 0, code, stderr)
	noC1("locks json", out)
	doc := parseLocksJSON(t, out)
	require.Len(t, doc.Locks, 1, out)
	require.NotNil(t, doc.Locks[0].Query)
	assert.Equal(t, query, *doc.Locks[0].Query, "JSON keeps the text, escaped")

	// leases: an owner, resource and metadata with C1 controls.
	schema, table := holdLease(t, pool, "o"+c1, "r"+c1, json.RawMessage(`{"k":"`+c1+`"}`))
	code, out, stderr = runCLI(t, nil, "leases", "--table", table)
	require.Equal(t, 0, code, stderr)
	noC1("leases text", out)
	assert.Contains(t, out, `"o\u009b2J\u0085x"`)
	assert.Contains(t, out, `"r\u009b2J\u0085x"`)
	code, out, stderr = runCLI(t, nil, "leases", "--table", table, "--json")
	require.Equal(t, 0, code, stderr)
	noC1("leases json", out)
	var ldoc leasesJSON
	require.NoError(t, json.Unmarshal([]byte(out), &ldoc), out)
	require.Len(t, ldoc.Leases, 1, out)
	assert.Equal(t, "o"+c1, ldoc.Leases[0].Owner)
	assert.JSONEq(t, `{"k":"`+c1+`"}`, string(ldoc.Leases[0].Metadata))

	// An error from the server that quotes such text (here a table name).
	code, _, stderr = runCLI(t, nil, "leases", "--table", schema+".t"+c1)
	assert.Equal(t, exitUnavailable, code, stderr)
	noC1("leases error", stderr)
	assert.True(t, strings.Contains(stderr, `\u009b`), stderr)
}

// Review round 25 (F-4): `locks` lists rows in advisory.ListLocks' order,
// int64 keys by their bits read unsigned (so a negative key after a
// positive one), then pairs; this pins the order that its comment now
// states.
func TestLocksOrder(t *testing.T) {
	pool := pgtest.Pool(t)
	v := pgtest.UniqueInt64(t) & (1<<62 - 1)
	a := pgtest.UniqueInt32(t) & (1<<30 - 1)
	ks := []keys.Key{keys.Int64(-v), keys.Int64(v), keys.Pair(-a, 1), keys.Pair(a, 1)}
	for _, k := range ks {
		hold(t, pool, k)
	}
	args := []string{"locks", "--json"}
	for _, k := range ks {
		args = append(args, "--key", k.String())
	}
	code, out, stderr := runCLI(t, nil, args...)
	require.Equal(t, 0, code, stderr)
	var got []string
	for _, l := range parseLocksJSON(t, out).Locks {
		got = append(got, l.Key)
	}
	assert.Equal(t, []string{ks[1].String(), ks[0].String(), ks[3].String(), ks[2].String()}, got)
}

// holdWithQuery takes key on a connection of pool with a statement whose
// text starts with a comment holding text (as pg_stat_activity then shows
// it), held until the test ends; it returns the statement.
func holdWithQuery(t *testing.T, pool *pgxpool.Pool, key keys.Key, text string) string {
	t.Helper()
	conn, err := pool.Acquire(ctxT(t))
	require.NoError(t, err)
	query := "/* " + text + " */ " + lockSQL(key, "pg_advisory_lock")
	_, err = conn.Exec(ctxT(t), query)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
			_ = conn.Conn().Close(ctx)
		}
		conn.Release()
	})
	return query
}

// holdLease holds resource for owner, with metadata (nil for none), in a
// lock-manager table of a fresh schema until the test ends; it returns the
// schema and the table's qualified name.
func holdLease(t *testing.T, pool *pgxpool.Pool, owner, resource string, metadata json.RawMessage) (schema, table string) {
	t.Helper()
	schema = pgtest.Schema(t, pool)
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute, Owner: owner})
	require.NoError(t, err)
	require.NoError(t, m.Migrate(ctxT(t)))
	var opts *lease.AcquireOptions
	if metadata != nil {
		opts = &lease.AcquireOptions{Metadata: metadata}
	}
	l, err := m.TryAcquire(ctxT(t), resource, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(ctxT(t)) })
	return schema, schema + "." + lease.DefaultTable
}
