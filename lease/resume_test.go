package lease_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// An offline lock in a web application: acquired in one request, renewed
// and released in later ones, possibly by another instance (another pool and
// Manager value), from a stored reference.
func TestResumeFromStoredRef(t *testing.T) {
	ctx := testCtx(t)
	p1, p2, schema := twoPools(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2, err := lease.NewManager(p2, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)

	l, err := m1.TryAcquire(ctx, "doc-42", nil)
	require.NoError(t, err)
	stored, err := json.Marshal(l.Ref())
	require.NoError(t, err)

	var ref lease.Ref
	require.NoError(t, json.Unmarshal(stored, &ref))
	resumed, err := m2.Resume(ref)
	require.NoError(t, err)
	assert.Equal(t, l.Token(), resumed.Token())
	require.NoError(t, resumed.Renew(ctx))
	assert.False(t, resumed.ExpiresAt().IsZero())

	// A forged reference (wrong id) can neither renew nor release.
	forged := ref
	forged.ID = "not-the-id"
	fl, err := m2.Resume(forged)
	require.NoError(t, err)
	assert.ErrorIs(t, fl.Renew(ctx), lease.ErrLeaseLost)
	assert.ErrorIs(t, fl.Release(ctx), lease.ErrLeaseLost)

	require.NoError(t, resumed.Release(ctx))
	assert.ErrorIs(t, l.Renew(ctx), lease.ErrLeaseLost, "released through the resumed value")

	_, err = m2.Resume(lease.Ref{Resource: "x"})
	assert.ErrorIs(t, err, lease.ErrInvalid)
}

func TestColumnResume(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	col := usersTable(t, pool, schema, time.Minute, 1)
	l, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	resumed, err := col.Resume(l.Ref())
	require.NoError(t, err)
	require.NoError(t, resumed.Renew(ctx))
	require.NoError(t, resumed.Release(ctx))
	assert.ErrorIs(t, l.Release(ctx), lease.ErrLeaseLost)
	_, err = col.Resume(lease.ColumnRef{ID: int64(1)})
	assert.ErrorIs(t, err, lease.ErrInvalid)
}
