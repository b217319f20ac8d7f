package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Issue 21 part 3: a ColumnRef whose token was edited to 2^62 was accepted by
// Resume, renewed (Renew returned nil), and its token then passed Fence.Update,
// after which the next legitimate holder's token 2 was refused by the fence.
// Every field of a ColumnRef edited by hand matches nothing: Resume refuses
// it (ErrInvalid) or Renew and Release report ErrLeaseLost / ErrNotFound, and
// the real holder's row is untouched.
func TestColumnRefEditedFieldMatchesNothing(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	col := usersTable(t, pool, schema, time.Minute, 1, 2)
	users := pgx.Identifier{schema, "users"}.Sanitize()
	other, err := col.TryAcquire(ctx, int64(2)) // row 2 is held too: an edited id must not reach it
	require.NoError(t, err)
	l, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	require.Equal(t, int64(1), l.Token())
	rowState := func(id int64) string {
		return queryOne[string](t, pool, "SELECT concat_ws('/', identity_action_locked_at, identity_action_locked_by, identity_action_fence) FROM "+users+" WHERE id = $1", id)
	}
	before1, before2 := rowState(1), rowState(2)

	edits := map[string]func(r *lease.ColumnRef){
		"token 2^62":       func(r *lease.ColumnRef) { r.Token = 1 << 62 },
		"token +1":         func(r *lease.ColumnRef) { r.Token++ },
		"token 0":          func(r *lease.ColumnRef) { r.Token = 0 },
		"token -1":         func(r *lease.ColumnRef) { r.Token = -1 },
		"owner other uuid": func(r *lease.ColumnRef) { r.Owner = other.Owner() },
		"owner upper case": func(r *lease.ColumnRef) { r.Owner = strings.ToUpper(r.Owner) },
		"owner no dashes":  func(r *lease.ColumnRef) { r.Owner = strings.ReplaceAll(r.Owner, "-", "") },
		"owner braces":     func(r *lease.ColumnRef) { r.Owner = "{" + r.Owner + "}" },
		"owner truncated":  func(r *lease.ColumnRef) { r.Owner = r.Owner[:35] },
		"id other row":     func(r *lease.ColumnRef) { r.ID = int64(2) },
		"id other row, owner and token of it": func(r *lease.ColumnRef) {
			r.ID = int64(2)
			r.Token = other.Token() + 100
		},
		"id missing row": func(r *lease.ColumnRef) { r.ID = int64(99) },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			ref := l.Ref()
			edit(&ref)
			forged, err := col.Resume(ref)
			if err != nil {
				require.ErrorIs(t, err, lease.ErrInvalid)
				return
			}
			for what, err := range map[string]error{"renew": forged.Renew(ctx), "release": forged.Release(ctx)} {
				require.Error(t, err, what)
				assert.True(t, errors.Is(err, lease.ErrLeaseLost) || errors.Is(err, lease.ErrNotFound),
					"%s of an edited ColumnRef: %v", what, err)
			}
		})
	}
	assert.Equal(t, before1, rowState(1), "the real holder's row is untouched")
	assert.Equal(t, before2, rowState(2), "the other row is untouched")
	require.NoError(t, l.Renew(ctx), "the real holder still renews")

	// The fence is not poisoned: the next legitimate holder's token is
	// accepted after the real one's.
	require.NoError(t, l.Release(ctx))
	next, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	assert.Equal(t, int64(2), next.Token())
	require.NoError(t, next.Release(ctx))
	require.NoError(t, other.Release(ctx))
}

// The same for every field of a manager Ref: Resource, ID, Token and Mode
// edited match nothing; an edited TTL is ignored (the Manager's TTL is used).
func TestRefEditedFieldMatchesNothing(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: 30 * time.Second})
	other, err := m.TryAcquire(ctx, "doc-2", nil)
	require.NoError(t, err)
	l, err := m.TryAcquire(ctx, "doc-1", nil)
	require.NoError(t, err)
	holders := pgx.Identifier{schema, lease.DefaultTable}.Sanitize()
	state := func() string {
		return queryOne[string](t, pool, "SELECT string_agg(concat_ws('/', resource, lease_id, mode, token, expires_at), ';' ORDER BY resource) FROM "+holders)
	}
	before := state()

	edits := map[string]func(r *lease.Ref){
		"resource other held": func(r *lease.Ref) { r.Resource = "doc-2" },
		"resource missing":    func(r *lease.Ref) { r.Resource = "doc-3" },
		"id":                  func(r *lease.Ref) { r.ID = other.Ref().ID },
		"id edited":           func(r *lease.Ref) { r.ID = strings.ToUpper(r.ID) },
		"token 2^62":          func(r *lease.Ref) { r.Token = 1 << 62 },
		"token +1":            func(r *lease.Ref) { r.Token++ },
		"token 0":             func(r *lease.Ref) { r.Token = 0 },
		"mode":                func(r *lease.Ref) { r.Mode = lease.Shared },
		"mode unknown":        func(r *lease.Ref) { r.Mode = 9 },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			ref := l.Ref()
			edit(&ref)
			forged, err := m.Resume(ref)
			if err != nil {
				require.ErrorIs(t, err, lease.ErrInvalid)
				return
			}
			assert.ErrorIs(t, forged.Renew(ctx), lease.ErrLeaseLost)
			assert.ErrorIs(t, forged.Release(ctx), lease.ErrLeaseLost)
		})
	}
	assert.Equal(t, before, state(), "no row touched")

	t.Run("ttl", func(t *testing.T) {
		ref := l.Ref()
		ref.TTL = 1000 * time.Hour
		resumed, err := m.Resume(ref)
		require.NoError(t, err)
		require.NoError(t, resumed.Renew(ctx))
		left := queryOne[float64](t, pool, "SELECT extract(epoch FROM expires_at - now())::float8 FROM "+holders+" WHERE resource = 'doc-1'")
		assert.LessOrEqual(t, left, 30.0, "renewed for the Manager's TTL, not the Ref's")
	})
	require.NoError(t, l.Release(ctx))
	require.NoError(t, other.Release(ctx))
}

// Issue 21 part 6 (column leases): a ColumnRef owner with a NUL byte or
// invalid UTF-8 reached SQL (22021), a non-uuid owner for a uuid owner column
// reached SQL (22P02) and a 2,000-byte owner came back whole in the error.
// Resume refuses every owner that is not an owner token, before any SQL, in
// an error that does not echo it.
func TestColumnRefOwnerBadInputIsInvalid(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	mustExec(t, pool, "CREATE TABLE "+jobs+" (id bigint PRIMARY KEY, locked_at timestamptz, locked_by uuid, lock_fence bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+jobs+" VALUES (1)")
	uuidCol, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
	require.NoError(t, err)
	textCol := usersTable(t, pool, schema, time.Minute, 1)
	long := strings.Repeat("x", 2000)
	for name, owner := range map[string]string{
		"nul": "a\x00b", "nul in uuid": "00000000-0000-4000-8000-00000000000\x00",
		"invalid utf-8": "\xff\xfe", "not a uuid": "not-a-uuid", "2000 bytes": long,
		"upper-case uuid": "0A1B2C3D-0000-4000-8000-0000000000AB", // a uuid column would match it as the lower-case one

	} {
		for cname, c := range map[string]*lease.Column{"uuid column": uuidCol, "text column": textCol} {
			t.Run(name+"/"+cname, func(t *testing.T) {
				l, err := c.Resume(lease.ColumnRef{ID: int64(1), Owner: owner, Token: 1})
				if err == nil { // before the fix: the owner reached SQL
					err = l.Renew(ctx)
				}
				require.ErrorIs(t, err, lease.ErrInvalid)
				assert.Less(t, len(err.Error()), 200, "the error does not echo the owner: %.300s", err.Error())
			})
		}
	}
}
