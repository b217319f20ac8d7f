package lease_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// TestAcquireAllErrorIsNotAnError: (Try)AcquireAll returned an errors.Join
// value and ColumnRef.UnmarshalJSON a plain wrapped ErrInvalid, though
// "every error is an *lease.Error". Both are now *Error values (type
// assertion, not only errors.As), and errors.Is still finds every cause.
func TestAcquireAllErrorIsNotAnError(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: 5 * time.Second})
	h, err := m.TryAcquire(ctx, "b", nil)
	require.NoError(t, err)
	defer func() { _ = h.Release(ctx) }()

	_, err = m.TryAcquireAll(ctx, []string{"a", "b"}, nil)
	e, direct := err.(*lease.Error)
	require.True(t, direct, "TryAcquireAll's error is %T, not *lease.Error", err)
	assert.Equal(t, "b", e.Resource)
	assert.ErrorIs(t, err, lease.ErrNotAcquired)
	var as *lease.Error
	assert.ErrorAs(t, err, &as)

	// Invalid input, before anything is acquired.
	_, err = m.AcquireAll(ctx, nil, nil)
	_, direct = err.(*lease.Error)
	assert.True(t, direct, "AcquireAll(nil): %T", err)
	assert.ErrorIs(t, err, lease.ErrInvalid)

	for _, doc := range []string{
		`{"id":5.5,"owner":"x","token":1}`, `{"id":[1],"owner":"x","token":1}`,
		`{"id":1,"owner":7,"token":1}`, `{"id":1e400,"owner":"x","token":1}`,
	} {
		var ref lease.ColumnRef
		err := json.Unmarshal([]byte(doc), &ref)
		_, direct := err.(*lease.Error)
		assert.True(t, direct, "%s: %T %v", doc, err, err)
		assert.ErrorIs(t, err, lease.ErrInvalid, doc)
	}
	var ute *json.UnmarshalTypeError
	var ref lease.ColumnRef
	assert.True(t, errors.As(json.Unmarshal([]byte(`{"id":1,"owner":7}`), &ref), &ute))
}
