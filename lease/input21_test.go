package lease_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// requireInvalidBeforeSQL asserts err is ErrInvalid with no server error in
// its chain, and that its text does not echo a long input whole.
func requireInvalidBeforeSQL(t *testing.T, err error, what string) {
	t.Helper()
	require.ErrorIs(t, err, lease.ErrInvalid, what)
	var pgErr *pgconn.PgError
	require.False(t, errors.As(err, &pgErr), "%s reached the server: %v", what, err)
	var le *lease.Error
	require.True(t, errors.As(err, &le), what)
	assert.Less(t, len(err.Error()), 2*lease.MaxErrorResourceLen+200, "%s: the error echoes its input whole", what)
}

// Issue 21 item 6: metadata that encoding/json accepts and jsonb refuses
// reached the server ({"n":1e1000000}: 22003; {"s":"\ud800"}: 22P02). The
// server is the oracle: for each value on either side of numeric's limits
// and of surrogate pairing, the acquisition succeeds exactly when jsonb
// accepts the value, and is ErrInvalid before any SQL otherwise.
func TestMetadataJSONBRefusesIsInvalid(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	values := []string{
		`{"n":1e1000000}`, `{"s":"\ud800"}`, `{"s":"\udc00"}`, `{"s":"\ud800x"}`, `{"s":"\ud800\u0041"}`,
		`{"s":"\ud83d\ude00"}`, `{"s":"\uD83D\uDE00"}`, `{"s":"\\ud800"}`, `["\ud800\ud800"]`,
		`[1e131071]`, `[1e131072]`, `[9.99e131071]`, `[99.9e131071]`, `[-1e131072]`, `[1E+131071]`,
		`[0.001e131074]`, `[0.001e131075]`, `[1e-16383]`, `[1e-16384]`, `[0.1e-16382]`, `[0.1e-16383]`,
		`[0e-16383]`, `[0e-16384]`, `[0e131073]`, `[0.0e1000000]`, `[1e99999999999999999999]`, `[1e-99999999999999999999]`,
		`[1e1073741822]`, `[0e1073741823]`, `[123456.789e-3]`, `[0]`, `[-0.0]`, `{"k\ud800":1}`,
		"{\"s\":\"\xff\"}", "{\"s\":\"\xed\xa0\x80\"}", "{\"s\":\"\xc3\xa9\"}",
	}
	for i, v := range values {
		var serverErr error
		var out []byte
		serverErr = pool.QueryRow(ctx, "SELECT $1::text::jsonb::text", v).Scan(&out)
		resource := "m" + string(rune('a'+i))
		l, err := m.TryAcquire(ctx, resource, &lease.AcquireOptions{Metadata: json.RawMessage(v)})
		if serverErr == nil {
			require.NoError(t, err, "jsonb accepts %s", v)
			require.NoError(t, l.Release(ctx))
			continue
		}
		t.Logf("%s: %v", v, serverErr)
		requireInvalidBeforeSQL(t, err, v)
	}
}

// Issue 21 item 6: a NUL byte or invalid UTF-8 in a List or ListIntents
// filter reached the server (22021), as did a nil or NUL Fence.Update key
// (a nil key was ErrNotFound). A long filter or key is not echoed whole.
func TestFiltersAndFenceKeysInvalidBeforeSQL(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute})
	bad := map[string]string{"NUL": "a\x00b", "invalid UTF-8": "a\xffb", "long": strings.Repeat("x", 2000)}
	for name, s := range bad {
		_, err := m.List(ctx, &lease.ListOptions{Resource: s})
		requireInvalidBeforeSQL(t, err, "List resource "+name)
		_, err = m.List(ctx, &lease.ListOptions{Owner: s})
		requireInvalidBeforeSQL(t, err, "List owner "+name)
		_, err = m.ListIntents(ctx, &lease.ListOptions{Resource: s})
		requireInvalidBeforeSQL(t, err, "ListIntents resource "+name)
	}
	_, err := m.List(ctx, &lease.ListOptions{Resource: "fine", Owner: "fine"})
	require.NoError(t, err)

	docs := pgx.Identifier{schema, "docs"}.Sanitize()
	mustExec(t, pool, "CREATE TABLE "+docs+" (id text PRIMARY KEY, body text, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+docs+" (id) VALUES ('d')")
	f, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: "docs"})
	require.NoError(t, err)
	set := map[string]any{"body": "x"}
	var nilPtr *string
	for name, key := range map[string]any{"nil": nil, "typed nil": nilPtr, "NUL": "d\x00", "invalid UTF-8": "d\xff", "long": strings.Repeat("d", 2000)} {
		requireInvalidBeforeSQL(t, f.Update(ctx, pool, key, 1, set), "Fence.Update key "+name)
	}
	require.NoError(t, f.Update(ctx, pool, "d", 1, set))
}

// Issue 21 item 6: a Table or Schema name containing "{next_fence}" passed
// NewManager and Migrate, then every TryAcquire failed with 42P01: a second
// substitution pass ran over the already-quoted names. Names are
// substituted once, whatever they contain.
func TestPlaceholderInNamesIsJustAName(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool) + "{next_fence}"
	mustExec(t, pool, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	t.Cleanup(func() { mustExec(t, pool, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	for _, cfg := range []lease.ManagerConfig{
		{Schema: schema, Table: "t{next_fence}"},
		{Schema: schema, Table: "u{holders}{resources}"},
		{Schema: schema, Table: "v{owner_idx}"},
	} {
		cfg.TTL = time.Minute
		m, err := lease.NewManager(pool, cfg)
		require.NoError(t, err)
		require.NoError(t, m.Migrate(ctx))
		for want := int64(1); want <= 2; want++ {
			l, err := m.TryAcquire(ctx, "r", nil)
			require.NoError(t, err, cfg.Table)
			assert.Equal(t, want, l.Token())
			require.NoError(t, l.Release(ctx))
		}
		assert.Equal(t, 1, queryOne[int](t, pool, "SELECT count(*) FROM "+pgx.Identifier{schema, cfg.Table + "_resources"}.Sanitize()))
	}
}

// Issue 21 item 6: errors that echo input cap its length. A 10,000-byte
// dotted table name was quoted whole, twice, in NewManager's error.
func TestLongDottedTableNotEchoed(t *testing.T) {
	pool := pgtest.Pool(t)
	_, err := lease.NewManager(pool, lease.ManagerConfig{Table: strings.Repeat("a.", 5000), TTL: time.Minute})
	requireInvalidBeforeSQL(t, err, "dotted table")
	_, err = lease.NewColumn(pool, lease.ColumnConfig{Table: strings.Repeat("a.", 5000), TTL: time.Minute})
	requireInvalidBeforeSQL(t, err, "dotted column table")
}
