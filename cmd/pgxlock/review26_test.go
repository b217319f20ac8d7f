package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// leakedRuns lists every 4-byte run of pw found in out.
func leakedRuns(out, pw string) []string {
	var l []string
	for i := 0; i+4 <= len(pw); i++ {
		if strings.Contains(out, pw[i:i+4]) {
			l = append(l, pw[i:i+4])
		}
	}
	return l
}

// noRunLeak runs locks, leases and run with env and checks that each exits
// with code and that neither stdout nor stderr shares 4 bytes in a row with
// pw.
func noRunLeak(t *testing.T, code int, env []string, pw string) {
	t.Helper()
	for _, args := range [][]string{{"locks"}, {"leases"}, {"run", "--key", "1", "--", "echo", "ran"}} {
		got, out, errOut := runInProcess(t, env, args...)
		assert.Equal(t, code, got, "%v %v: %s", env, args, errOut)
		assert.Empty(t, leakedRuns(out+errOut, pw), "%v %v: %s", env, args, errOut)
		assert.NotContains(t, out, "ran")
	}
}

// testServer is the test database's host, port, user and database, as
// key=value settings.
func testServer(t *testing.T) (host string, port uint16, user, db, kv string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	kv = fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	return cfg.Host, cfg.Port, cfg.User, cfg.Database, kv
}

// Review round 26 (F-1): an @ (or / or ?) in a URL's user name (the Azure
// "user@server" form without %40) kept the user info from being masked:
// the exit-64 message showed the password.
func TestBadURLUserWithAtHidesPassword(t *testing.T) {
	const pw = "Qz7Wk9Jm"
	for _, cs := range []string{
		"postgres://app@myserver:Qz7Wk9Jm@127.0.0.1:5432/test",
		"postgres://app@myserver:Qz7Wk9Jm@127.0.0.1:5432/test?sslmode=bogus",
		"postgres://app/x:Qz7Wk9Jm@127.0.0.1:5432/test?sslmode=bogus",
		"postgres://app?x:Qz7Wk9Jm@127.0.0.1:5432/test?sslmode=bogus",
	} {
		badSettingsLeak(t, []string{"DATABASE_URL=" + cs}, pw, "Qz7W", "k9Jm")
	}
}

// Review round 26 (F-2, F-3): settings that parse, but whose password the
// server or pgx quotes in a connect error (exit 69): a URL with a leading
// space or an upper-case scheme is key=value for pgx, which sends it whole
// as a parameter name; the tail of a password with an unescaped & or ', or
// a space, becomes a parameter the server names.
func TestServerErrorHidesPassword(t *testing.T) {
	host, port, user, db, kv := testServer(t)
	for _, tc := range []struct{ cs, pw string }{
		{" postgres://app:Qz7Wk9Jm@db.example.com/prod?sslmode=disable " + kv, "Qz7Wk9Jm"},
		{"POSTGRES://app:Qz7Wk9Jm@db.example.com/prod?sslmode=disable " + kv, "Qz7Wk9Jm"},
		{fmt.Sprintf("postgres://%s@%s:%d/%s?password=ab&Secretword=1", user, host, port, db), "ab&Secretword=1"},
		{kv + " password='Pa'Secretword=1'", "Pa'Secretword=1"},
		{kv + " password=Qz7W k9Jmx=1", "Qz7W k9Jmx=1"},
	} {
		noRunLeak(t, exitUnavailable, []string{"DATABASE_URL=" + tc.cs}, tc.pw)
	}
	// The server's error is still shown, with the password masked.
	code, _, errOut := runInProcess(t, []string{"DATABASE_URL= postgres://app:Qz7Wk9Jm@db.example.com/prod?sslmode=disable " + kv}, "locks")
	assert.Equal(t, exitUnavailable, code)
	assert.Contains(t, errOut, `invalid configuration parameter name "postgres://app:xxxxx@db.example.com/prod?sslmode"`)
}

// Review round 26 (F-4): a user-info password of digits, a / and more
// makes pgx read the digits as a port and the rest as the database name,
// which its connect error showed; also in --watch's error lines.
func TestConnectErrorHidesPasswordTail(t *testing.T) {
	const pw = "1/Spring"
	env := []string{"DATABASE_URL=postgres://127.0.0.1:1/Spring@127.0.0.1:5432/test"}
	noRunLeak(t, exitUnavailable, env, pw)
	for _, json := range []bool{false, true} {
		args := []string{"locks", "--watch", "--interval", "100ms"}
		if json {
			args = append(args, "--json")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		var out, errOut bytes.Buffer
		code := run(ctx, args, nil, &out, &errOut, env)
		cancel()
		assert.Equal(t, exitOK, code)
		assert.Contains(t, out.String()+errOut.String(), "connect:", "the error is reported")
		assert.Empty(t, leakedRuns(out.String()+errOut.String(), pw), "%s%s", out.String(), errOut.String())
	}
}

// Review round 26: the secret set and the scrubbing of one message.
func TestScrubSecrets(t *testing.T) {
	hidden := secretsOf(env{"DATABASE_URL=postgres://127.0.0.1:1/Spring@127.0.0.1:5432/test", "PGPASSWORD=Env5ecret"})
	assert.Contains(t, hidden, "1/Spring")
	assert.Contains(t, hidden, "Env5ecret")
	hidden = secretsOf(env{"DATABASE_URL=postgres://u:Cl%40an1@h/db"})
	assert.Contains(t, hidden, "Cl@an1", "the password pgx decoded")

	// A message that names part of a secret without quoting it is replaced
	// by its class.
	h := []string{"1/Spring"}
	got := scrubArg(errors.New("connect: failed to connect to user=root database=Spring@127.0.0.1"), h)
	assert.NotContains(t, got, "Spring")
	assert.Contains(t, got, "connect: failed to connect")
	got = scrubArg(fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "42704", Message: "no Spring here"}), h)
	assert.Equal(t, "connect: the server refused the connection (SQLSTATE 42704) "+
		"(the error text is not shown, as it may quote part of a secret in the connection settings)", got)
	got = scrubArg(&pgconn.PgError{Code: "42704", Message: "Spring"}, h)
	assert.Contains(t, got, "server error (SQLSTATE 42704)")
	// A whole secret is masked and the rest kept; a quoted piece of one too.
	assert.Equal(t, `bad "xxxxx" and xxxxx`, scrubArg(errors.New(`bad "Spring" and 1/Spring`), h))
	assert.Equal(t, 42, scrubArg(42, h))
	var b bytes.Buffer
	s := stdio{hide: func() []string { return h }}
	s.msgf(&b, "x %s %v %d\n", "a 1/Spring", errors.New("Springtime"), 7)
	assert.Equal(t, "x a xxxxx error (the error text is not shown, as it may quote part of a secret in the connection settings) 7\n", b.String())
}

// Review round 26 (F-5, F-6): bidi controls and zero-width characters were
// printed raw in text output (they are format characters, not controls),
// and DEL raw in JSON.
func TestOutputFiltersBidiAndDEL(t *testing.T) {
	const bidi = "\u202eEVIL\u200bzw\u2066\ufeff"
	assert.Equal(t, "a EVIL zw b", cell("a"+bidi+"b", 0))
	assert.Equal(t, `"\u202eEVIL"`, quoteCell("\u202eEVIL", 40))
	assert.Equal(t, `x\u202ey\u200bz\u200e`, safeText("x\u202ey\u200bz\u200e"))
	assert.Equal(t, `{"q":"a\u007fb\u202e\u2060"}`, string(jsonControlSafe([]byte("{\"q\":\"a\x7fb\u202e\u2060\"}"))))

	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	query := holdWithQuery(t, pool, key, bidi+"\x7f")
	raw := func(what, s string) {
		t.Helper()
		for _, r := range "\u202e\u200b\u2066\ufeff\x7f" {
			assert.NotContains(t, s, string(r), "%s: %q", what, r)
		}
	}
	code, out, stderr := runCLI(t, nil, "locks", "--show-query", "--key", key.String())
	require.Equal(t, 0, code, stderr)
	raw("locks text", out)
	assert.Contains(t, out, "/* EVIL zw */")
	code, out, stderr = runCLI(t, nil, "locks", "--show-query", "--json", "--key", key.String())
	require.Equal(t, 0, code, stderr)
	raw("locks json", out)
	doc := parseLocksJSON(t, out)
	require.Len(t, doc.Locks, 1, out)
	require.NotNil(t, doc.Locks[0].Query)
	assert.Equal(t, query, *doc.Locks[0].Query, "JSON keeps the text, escaped")

	_, table := holdLease(t, pool, "o\u200bzw", "\u202eEVIL\x7f", nil)
	code, out, stderr = runCLI(t, nil, "leases", "--table", table)
	require.Equal(t, 0, code, stderr)
	raw("leases text", out)
	assert.Contains(t, out, `"\u202eEVIL\x7f"`)
	assert.Contains(t, out, `"o\u200bzw"`)
	code, out, stderr = runCLI(t, nil, "leases", "--table", table, "--json")
	require.Equal(t, 0, code, stderr)
	raw("leases json", out)
	assert.Contains(t, out, `\u202eEVIL\u007f`)
}
