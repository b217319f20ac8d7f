package main

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func TestParseKey(t *testing.T) {
	ns := namespaces{}
	require.NoError(t, ns.addList("clitest-billing=7001, clitest-jobs=-8"))
	billing, _ := keys.LookupNamespace(7001)
	h, err := billing.Hash("tenant-1")
	require.NoError(t, err)
	for _, tc := range []struct {
		in   string
		want keys.Key
	}{
		{"123", keys.Int64(123)},
		{"-9223372036854775808", keys.Int64(-1 << 63)},
		{"+5", keys.Int64(5)},
		{"7,42", keys.Pair(7, 42)},
		{" -7 , 42 ", keys.Pair(-7, 42)},
		{"int64:123", keys.Int64(123)},
		{"pair:7,42", keys.Pair(7, 42)},
		{"ns:clitest-billing/42", keys.Pair(7001, 42)},
		{"ns:clitest-billing(7001)/42", keys.Pair(7001, 42)},
		{"ns:clitest-jobs/-1", keys.Pair(-8, -1)},
		{"ns:clitest-billing/hash:tenant-1", h},
		{"ns:clitest-new(7002)/1", keys.Pair(7002, 1)},
		{"hash:123", keys.Hash("123")},
		{"hash:", keys.Hash("")},
		{"hash:int64:5", keys.Hash("int64:5")},
		{"migrations", keys.Hash("migrations")},
		{"1,2,3", keys.Hash("1,2,3")},
		{"12a", keys.Hash("12a")},
		{"état", keys.Hash("état")},
	} {
		got, err := ns.parseKey(tc.in)
		if assert.NoError(t, err, tc.in) {
			assert.Equal(t, tc.want, got, tc.in)
		}
	}
	// The String form of every key parses back to the key.
	for _, k := range []keys.Key{keys.Int64(-5), keys.Pair(-1, 2), keys.Pair(7001, 3), h} {
		got, err := ns.parseKey(k.String())
		require.NoError(t, err, k.String())
		assert.Equal(t, k, got)
	}
	for _, bad := range []string{
		"", "99999999999999999999", "7,3000000000", "int64:x", "int64:", "pair:1", "pair:a,b",
		"ns:unknown-ns/1", "ns:clitest-billing/x", "ns:clitest-billing/hash:", "ns:clitest-billing(7003)/1",
		"ns:", "ns:bad name/1",
	} {
		_, err := ns.parseKey(bad)
		assert.ErrorIs(t, err, errKeySyntax, "%q", bad)
	}
	assert.Error(t, ns.addList("x"))
	assert.Error(t, ns.addList("clitest-x=99999999999"))
	assert.Error(t, ns.addList("clitest-billing=5"), "a name keeps its id")
}

func runInProcess(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, nil, &out, &errOut, env)
	return code, out.String(), errOut.String()
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{nil, exitUsage, "", "Usage:"},
		{[]string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{[]string{"help"}, exitOK, "Key syntax", ""},
		{[]string{"-h"}, exitOK, "Exit codes", ""},
		{[]string{"--help"}, exitOK, "pgxlock run", ""},
		{[]string{"help", "run"}, exitOK, "-try", ""},
		{[]string{"help", "nope"}, exitUsage, "", "unknown command"},
		{[]string{"run", "-h"}, exitOK, "", "-heartbeat"},
		{[]string{"version"}, exitOK, "pgxlock ", ""},
		{[]string{"run", "--", "true"}, exitUsage, "", "--key is required"},
		{[]string{"run", "--key", "1"}, exitUsage, "", "no command"},
		{[]string{"run", "--key", "1", "--try", "--wait", "1s", "--", "true"}, exitUsage, "", "exclude each other"},
		{[]string{"run", "--key", "1", "--wait", "-1s", "--", "true"}, exitUsage, "", "--wait"},
		{[]string{"run", "--key", "99999999999999999999", "--", "true"}, exitUsage, "", "bad key"},
		{[]string{"run", "--bogus", "--key", "1", "--", "true"}, exitUsage, "", "flag provided but not defined"},
		{[]string{"run", "--key", "1", "--", "/nonexistent/pgxlock-test"}, exitNotFound, "", "no such file"},
		{[]string{"locks", "extra"}, exitUsage, "", "unexpected argument"},
		{[]string{"locks", "--watch", "--interval", "0s"}, exitUsage, "", "--interval"},
		{[]string{"locks", "--key", ""}, exitUsage, "", "bad key"},
		{[]string{"leases", "--table", "a.b.c"}, exitUsage, "", "--table"},
	} {
		code, out, errOut := runInProcess(t, nil, tc.args...)
		assert.Equal(t, tc.code, code, "%q: stderr %s", tc.args, errOut)
		assert.Contains(t, out, tc.out, "%q", tc.args)
		assert.Contains(t, errOut, tc.err, "%q", tc.args)
	}
}

// Without DATABASE_URL the PG* variables of the environment are used.
func TestConnectionFromPGVariables(t *testing.T) {
	cfg, err := pgx.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	env := []string{
		"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)), "PGUSER=" + cfg.User,
		"PGDATABASE=" + cfg.Database, "PGPASSWORD=" + cfg.Password, "PGSSLMODE=disable",
		"PGAPPNAME=someone else", // overridden: the CLI always says who it is
	}
	got, err := connConfig(env)
	require.NoError(t, err)
	assert.Equal(t, cfg.Host, got.Host)
	assert.Equal(t, cfg.Port, got.Port)
	assert.Equal(t, cfg.Database, got.Database)
	assert.Equal(t, appName, got.RuntimeParams["application_name"])

	code, out, errOut := runInProcess(t, env, "locks", "--json", "--key", "1,2")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"locks":[]`)

	// DATABASE_URL wins over PG* variables.
	env = append(env, "DATABASE_URL="+pgtest.DSN(t), "PGPORT=1")
	code, _, errOut = runInProcess(t, env, "locks", "--json", "--key", "1,2")
	require.Equal(t, 0, code, errOut)
}

// Connection failures exit 69 and never run the command.
func TestConnectionFailure(t *testing.T) {
	env := []string{"DATABASE_URL=postgres://postgres:sekrit@127.0.0.1:1/postgres?connect_timeout=5&sslmode=disable"}
	code, _, errOut := runInProcess(t, env, "locks")
	assert.Equal(t, exitUnavailable, code, errOut)
	assert.NotContains(t, errOut, "sekrit")
	code, _, errOut = runInProcess(t, env, "leases")
	assert.Equal(t, exitUnavailable, code, errOut)
	code, out, errOut := runInProcess(t, env, "run", "--key", "1", "--", "echo", "ran")
	assert.Equal(t, exitUnavailable, code, errOut)
	assert.NotContains(t, out, "ran")
	assert.Contains(t, errOut, "the command was not run")

	code, _, errOut = runInProcess(t, []string{"DATABASE_URL=postgres://a:sekrit@host:notaport/x"}, "locks")
	assert.Equal(t, exitUnavailable, code, errOut)
	assert.NotContains(t, errOut, "sekrit")
}
