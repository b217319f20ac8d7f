package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The key parser accepts exactly the documented forms; anything that looks like a
// mistyped number or prefix is a usage error, and every hashed string is reported.
func TestParseKey(t *testing.T) {
	ns := namespaces{}
	require.NoError(t, ns.addList("clitest-billing=7001, clitest-jobs=-8"))
	billing, _ := keys.LookupNamespace(7001)
	h, err := billing.Hash("tenant-1")
	require.NoError(t, err)
	for _, tc := range []struct {
		in     string
		want   keys.Key
		hashed bool
	}{
		{"123", keys.Int64(123), false},
		{"0", keys.Int64(0), false},
		{"-9223372036854775808", keys.Int64(-1 << 63), false},
		{"9223372036854775807", keys.Int64(1<<63 - 1), false},
		{"+5", keys.Int64(5), false},
		{"007", keys.Int64(7), false},
		{"7,42", keys.Pair(7, 42), false},
		{"-7,42", keys.Pair(-7, 42), false},
		{"-2147483648,2147483647", keys.Pair(-1<<31, 1<<31-1), false},
		{"int64:123", keys.Int64(123), false},
		{"int64:-5", keys.Int64(-5), false},
		{"pair:7,42", keys.Pair(7, 42), false},
		{"ns:clitest-billing/42", keys.Pair(7001, 42), false},
		{"ns:clitest-billing(7001)/42", keys.Pair(7001, 42), false},
		{"ns:clitest-jobs/-1", keys.Pair(-8, -1), false},
		{"ns:clitest-billing/hash:tenant-1", h, true},
		{"ns:clitest-new(7002)/1", keys.Pair(7002, 1), false},
		{"hash:123", keys.Hash("123"), true},
		{"hash:", keys.Hash(""), true},
		{"hash:int64:5", keys.Hash("int64:5"), true},
		{"hash: padded ", keys.Hash(" padded "), true},
		{"hash:tenant:acme", keys.Hash("tenant:acme"), true},
		{"migrations", keys.Hash("migrations"), true},
		{"nightly-report", keys.Hash("nightly-report"), true},
		{"nightly report", keys.Hash("nightly report"), true},
		{"état", keys.Hash("état"), true},
		{"a,1", keys.Hash("a,1"), true},
		{"report v2: final", keys.Hash("report v2: final"), true},
	} {
		got, hashed, err := ns.parseKey(tc.in)
		if assert.NoError(t, err, tc.in) {
			assert.Equal(t, tc.want, got, tc.in)
			assert.Equal(t, tc.hashed, hashed, "%q hashed", tc.in)
		}
	}
	// The String form of every key parses back to the key.
	for _, k := range []keys.Key{keys.Int64(-5), keys.Pair(-1, 2), keys.Pair(7001, 3), h} {
		got, _, err := ns.parseKey(k.String())
		require.NoError(t, err, k.String())
		assert.Equal(t, k, got)
	}
	for _, tc := range []struct{ in, why string }{
		{"", "empty"},
		{"99999999999999999999", "not a bigint"},
		{"7,3000000000", "int4"},
		{"1,2,3", "looks like a number"},
		{"1e3", "looks like a number"},
		{"0x7b", "looks like a number"},
		{"1_000", "looks like a number"},
		{"1.5", "looks like a number"},
		{"12a", "looks like a number"},
		{"7,", "looks like a number"},
		{"-x", "looks like a number"},
		{".5", "looks like a number"},
		{" 123", "white space"},
		{"123 ", "white space"},
		{"7, 42", "looks like a number"},
		{"7 ,42", "looks like a number"},
		{"\t7,42", "white space"},
		{"migrations\n", "white space"},
		{"INT64:5", `unknown prefix "INT64:"`},
		{"Int64:5", `unknown prefix "Int64:"`},
		{"HASH:x", `unknown prefix "HASH:"`},
		{"Pair:1,2", `unknown prefix "Pair:"`},
		{"NS:clitest-billing/1", `unknown prefix "NS:"`},
		{"int:5", `unknown prefix "int:"`},
		{"int46:5", `unknown prefix "int46:"`},
		{"tenant:acme", "write hash:tenant:acme"},
		{"int64:0x10", "decimal"},
		{"int64: 5", "decimal"},
		{"int64:1e3", "decimal"},
		{"int64:x", "decimal"},
		{"int64:", "decimal"},
		{"pair:1", "pair:A,B"},
		{"pair:a,b", "pair:A,B"},
		{"pair:7, 42", "pair:A,B"},
		{"pair:1,2,3", "pair:A,B"},
		{"ns:unknown-ns/1", "unknown namespace"},
		{"ns:clitest-billing/x", "decimal int4"},
		{"ns:clitest-billing/ 1", "decimal int4"},
		{"ns:clitest-billing/0x1", "decimal int4"},
		{"ns:clitest-billing/3000000000", "int4"},
		{"ns:clitest-billing/hash:", "empty"},
		{"ns:clitest-billing(7003)/1", "conflict"},
		{"ns:", "want ns:NAME"},
		{"ns:bad name/1", "want ns:NAME"},
	} {
		_, _, err := ns.parseKey(tc.in)
		if assert.ErrorIs(t, err, errKeySyntax, "%q", tc.in) {
			msg := err.Error()
			assert.Contains(t, strings.ToLower(msg), strings.ToLower(tc.why), "%q", tc.in)
			assert.Contains(t, msg, keyForms, "%q: the error shows the accepted forms", tc.in)
		}
	}
	assert.Error(t, ns.addList("x"))
	assert.Error(t, ns.addList("clitest-x=99999999999"))
	assert.Error(t, ns.addList("clitest-billing=5"), "a name keeps its id")
}

// A typo in a key is a usage error (64) that shows the accepted forms, never another lock;
// a hashed string is reported on stderr with the key it names.
func TestKeyTypoIsUsageError(t *testing.T) {
	for _, k := range []string{"1,2,3", "1e3", "0x7b", "INT64:5", " 123", "7, 42"} {
		code, out, errOut := runInProcess(t, nil, "run", "--key", k, "--", "echo", "ran")
		assert.Equal(t, exitUsage, code, "%q: %s", k, errOut)
		assert.NotContains(t, out, "ran")
		assert.Contains(t, errOut, "accepted forms", k)
		code, _, errOut = runInProcess(t, nil, "locks", "--key", k)
		assert.Equal(t, exitUsage, code, "%q: %s", k, errOut)
		assert.Contains(t, errOut, "accepted forms", k)
	}
	code, _, errOut := runInProcess(t, []string{"DATABASE_URL=" + pgtest.DSN(t)}, "locks", "--key", "nightly-report")
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, errOut, "--key is a hashed string: "+keys.Hash("nightly-report").String())
	assert.NotContains(t, errOut, "nightly-report", "the source string is never shown")
	code, _, errOut = runInProcess(t, []string{"DATABASE_URL=" + pgtest.DSN(t)}, "locks", "--key", "7,42")
	assert.Equal(t, exitOK, code, errOut)
	assert.NotContains(t, errOut, "hashed")
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
		// Review 31j: 0s passed as "positive", meaning "wait forever", and with --try.
		{[]string{"run", "--key", "1", "--wait", "0s", "--", "true"}, exitUsage, "", "--wait must be positive"},
		{[]string{"run", "--key", "1", "--try", "--wait", "0s", "--", "true"}, exitUsage, "", "exclude each other"},
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

	// A key of the test's own: other packages' tests run on the same server at once.
	code, out, errOut := runInProcess(t, env, "locks", "--json", "--key", keys.Int64(pgtest.UniqueInt64(t)).String())
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

}

// Connection settings that cannot be parsed exit 64 with the parser's reason and the
// settings shown, every password masked; nothing connects and no command runs.
func TestBadConnectionSettings(t *testing.T) {
	for _, tc := range []struct {
		env    []string
		reason string // from the parser
		shown  string // the settings, masked
	}{
		{[]string{"DATABASE_URL=postgres://a:sekrit@host:notaport/x"}, "notaport", "postgres://a:xxxxx@host:notaport/x"},
		{[]string{"DATABASE_URL=postgres://a:sekrit@127.0.0.1:99999/x"}, "99999", "postgres://a:xxxxx@127.0.0.1:99999/x"},
		{[]string{"DATABASE_URL=postgres://a:sekrit@127.0.0.1/x?sslmode=bogus"}, "sslmode is invalid", "sslmode=bogus"},
		{[]string{"DATABASE_URL=postgres://a@127.0.0.1/x?password=sekrit&sslmode=bogus"}, "sslmode is invalid", "password=xxxxx&sslmode=bogus"},
		{[]string{"DATABASE_URL=postgres://a:se%40krit@host:bad/x"}, "bad", "postgres://a:xxxxx@host:bad/x"},
		{[]string{"DATABASE_URL=host=127.0.0.1 password='sek rit' sslmode=bogus"}, "sslmode is invalid", "password=xxxxx sslmode=bogus"},
		{[]string{"DATABASE_URL=host=127.0.0.1 password=sekrit port=notaport"}, "notaport", "password=xxxxx"},
		{[]string{"PGHOST=127.0.0.1", "PGPASSWORD=sekrit", "PGSSLMODE=bogus"}, "sslmode is invalid", "PG* environment variables"},
	} {
		for _, args := range [][]string{
			{"locks"}, {"locks", "--watch"}, {"leases"}, {"run", "--key", "1", "--", "echo", "ran"},
		} {
			code, out, errOut := runInProcess(t, tc.env, args...)
			assert.Equal(t, exitUsage, code, "%v %v: %s", tc.env, args, errOut)
			assert.Contains(t, errOut, "cannot parse the connection settings", "%v %v", tc.env, args)
			assert.Contains(t, errOut, tc.reason, "%v %v: the parser's reason", tc.env, args)
			assert.Contains(t, errOut, tc.shown, "%v %v: the settings, masked", tc.env, args)
			assert.NotContains(t, errOut, "sekrit", "%v %v", tc.env, args)
			assert.NotContains(t, errOut, "sek rit", "%v %v", tc.env, args)
			assert.NotContains(t, errOut, "se@krit", "%v %v", tc.env, args)
			assert.NotContains(t, errOut, "se%40krit", "%v %v", tc.env, args)
			assert.NotContains(t, out, "ran")
		}
	}
}

// A server that accepts connections and never answers is unavailable (69), also for
// run --wait and --try: the key was never waited for, so it is neither a lock timeout
// (124) nor busy (75). The command does not run.
func TestSilentServerExits69(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var accepted []net.Conn
	acceptDone := make(chan struct{})
	go func() { // owned: ends when ln is closed below
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c) // held open, never read or written
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-acceptDone
		mu.Lock()
		defer mu.Unlock()
		for _, c := range accepted {
			_ = c.Close()
		}
	})
	url := "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable&connect_timeout=1"
	for _, tc := range []struct {
		url  string
		args []string
	}{
		{url, []string{"run", "--key", "1", "--wait", "300ms", "--", "echo", "ran"}},
		{url, []string{"run", "--key", "1", "--", "echo", "ran"}},
		{url, []string{"run", "--key", "1", "--try", "--", "echo", "ran"}},
		{url, []string{"locks"}},
		{url, []string{"leases"}},
	} {
		code, out, errOut := runInProcess(t, []string{"DATABASE_URL=" + tc.url}, tc.args...)
		assert.Equal(t, exitUnavailable, code, "%v: %s", tc.args, errOut)
		assert.NotContains(t, out, "ran", "%v", tc.args)
	}
	mu.Lock()
	assert.NotEmpty(t, accepted, "pgxlock connected to the silent server")
	mu.Unlock()
}
