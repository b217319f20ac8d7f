package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Review round 13: a password with an unescaped / in a URL, and one with a
// backslash-escaped space in a key=value string, were shown (in part) in
// the "cannot parse" message.
func TestBadConnectionSettingsMaskOddPasswords(t *testing.T) {
	for _, tc := range []struct {
		env    []string
		secret []string // none of these may appear
	}{
		{[]string{"DATABASE_URL=postgres://u:se/cret@host:5432/db"}, []string{"se/cret", "cret@"}},
		{[]string{`DATABASE_URL=host=h password=ab\ cdsecret sslmode=bogus`}, []string{"cdsecret", `ab\ cd`, "ab cd"}},
		// Review round 14: a URL pgx reads as key=value (a leading space or
		// tab), a percent-encoded key, an & inside a key=value password.
		{[]string{"DATABASE_URL= postgres://bob:SECRET@127.0.0.1:5432/db"}, []string{"SECRET"}},
		{[]string{"DATABASE_URL=\tpostgresql://bob:SECRET@127.0.0.1:5432/db"}, []string{"SECRET"}},
		{[]string{"DATABASE_URL=postgres://bob@127.0.0.1/db?pass%77ord=SECRET&sslmode=bogus"}, []string{"SECRET"}},
		{[]string{"DATABASE_URL=host=h password=ab&SECRET sslmode=bogus"}, []string{"SECRET"}},
		{[]string{"DATABASE_URL=host=h sslpassword='a b SECRET' sslmode=bogus"}, []string{"SECRET"}},
	} {
		code, _, errOut := runInProcess(t, tc.env, "locks")
		assert.Equal(t, exitUsage, code, "%v: %s", tc.env, errOut)
		assert.Contains(t, errOut, "xxxxx", "%v", tc.env)
		for _, s := range tc.secret {
			assert.NotContains(t, errOut, s, "%v", tc.env)
		}
	}
}

// Review round 13: "A connect timeout of 10 s applies unless connect_timeout
// is set": connect_timeout=0 (no timeout, for libpq and pgx) was replaced by
// the 10 s too.
func TestConnectTimeoutZeroIsKept(t *testing.T) {
	for _, tc := range []struct {
		env  env
		want time.Duration
	}{
		{env{"DATABASE_URL=postgres://u@127.0.0.1/db?connect_timeout=0"}, 0},
		{env{"DATABASE_URL=host=127.0.0.1 connect_timeout=0"}, 0},
		{env{"PGHOST=127.0.0.1", "PGCONNECT_TIMEOUT=0"}, 0},
		{env{"DATABASE_URL=postgres://u@127.0.0.1/db?connect_timeout=3"}, 3 * time.Second},
		{env{"DATABASE_URL=postgres://u@127.0.0.1/db"}, connectTimeout},
		{env{"DATABASE_URL=host=127.0.0.1 application_name=connect_timeout"}, connectTimeout},
		// Review round 14: inside another value it is not the setting.
		{env{"DATABASE_URL=host=127.0.0.1 password='x connect_timeout=1'"}, connectTimeout},
		{env{"DATABASE_URL=postgres://u@127.0.0.1/db?application_name=connect_timeout%3D0"}, connectTimeout},
		{env{"DATABASE_URL=postgres://u@127.0.0.1/db?connect%5Ftimeout=0"}, 0},
	} {
		cfg, err := connConfig(tc.env)
		require.NoError(t, err, "%v", tc.env)
		assert.Equal(t, tc.want, cfg.ConnectTimeout, "%v", tc.env)
	}
}

// withParams adds key=value settings to a connection string (URL or
// key=value form).
func withParams(t *testing.T, dsn string, kv ...string) string {
	t.Helper()
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		q := u.Query()
		for i := 0; i < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	for i := 0; i < len(kv); i += 2 {
		dsn += " " + kv[i] + "=" + kv[i+1]
	}
	return dsn
}

// Review round 13: "Waiting: by default until the lock is granted": a
// statement_timeout (or lock_timeout) in the connection settings ended the
// wait of a run without --wait, as exit 124, "timed out after 0s". The
// CLI's own sessions run with both at 0: the wait is --wait's alone.
func TestRunWaitsPastTheSettingsTimeouts(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	ctx := ctxT(t)
	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, lockSQL(key, "pg_advisory_lock"))
	require.NoError(t, err)
	ran := filepath.Join(t.TempDir(), "ran")
	dsn := withParams(t, pgtest.DSN(t), "statement_timeout", "200", "lock_timeout", "200")
	p := startCLI(t, "", []string{"DATABASE_URL=" + dsn}, "run", "--key", key.String(), "--", "touch", ran)
	waitCLI(t, pool, key, false)
	waitFor(t, waitTimeout, "the CLI's wait to outlast both timeouts threefold", func() bool {
		require.False(t, p.exited(), "pgxlock gave up: %s", p.stderr.String())
		for _, li := range cliLocks(t, pool, key) {
			var old bool
			require.NoError(t, pool.QueryRow(ctx, "SELECT $1::timestamptz < pg_catalog.now() - interval '600 ms'", li.WaitStart).Scan(&old))
			if !li.Granted && old {
				return true
			}
		}
		return false
	})
	_, err = holder.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock_all()")
	require.NoError(t, err)
	assert.Equal(t, 0, p.wait(), p.stderr.String())
	assert.True(t, fileExists(ran), "the command ran once the key was free")
	waitNoCLI(t, pool, key)
}

// Review round 13: a --wait shorter than a round trip exited 69 (cannot
// connect), because the Locker's proxy check ran inside the lock call's
// bound; "69 ... which --wait does not shorten". The check runs in the
// connect phase now: a held key times out (124).
func TestRunTinyWaitIsATimeoutNotUnavailable(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	hold(t, pool, key)
	ran := filepath.Join(t.TempDir(), "ran")
	code, _, stderr := runCLI(t, nil, "run", "--key", key.String(), "--wait", "100us", "--", "touch", ran)
	assert.Equal(t, exitTimeout, code, stderr)
	assert.False(t, fileExists(ran))
	waitNoCLI(t, pool, key)
}

// Review round 13: a --resource or --owner the library refuses before any
// SQL (too long, invalid UTF-8) is a usage error (64), not 69.
func TestLeasesBadFilterIsUsage(t *testing.T) {
	for _, args := range [][]string{
		{"leases", "--resource", strings.Repeat("r", 2000)},
		{"leases", "--resource", "\xff"},
		{"leases", "--owner", "\xff"},
	} {
		code, _, errOut := runInProcess(t, nil, args...)
		assert.Equal(t, exitUsage, code, "%q: %s", args[2], errOut)
	}
}
