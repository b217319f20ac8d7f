package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 6: List did not show writer intents, so an operator saw no
// exclusive holder while readers were being refused. ListIntents shows them.
func TestListIntentsShowsWaitingWriter(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	m1 := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	m2 := newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Hour})

	reader, err := m1.TryAcquire(ctx, "doc", &lease.AcquireOptions{Mode: lease.Shared})
	require.NoError(t, err)
	defer reader.Release(context.WithoutCancel(ctx))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := m2.Acquire(wctx, "doc", nil)
		done <- err
	}()
	var intents []lease.Intent
	require.Eventually(t, func() bool {
		intents, err = m1.ListIntents(ctx, nil)
		require.NoError(t, err)
		return len(intents) == 1
	}, 20*time.Second, 5*time.Millisecond, "the blocked writer's intent is listed")
	assert.Equal(t, "doc", intents[0].Resource)
	assert.False(t, intents[0].Expired)
	assert.Contains(t, intents[0].String(), "waiting")

	_, err = m1.TryAcquire(ctx, "doc", &lease.AcquireOptions{Mode: lease.Shared})
	require.ErrorIs(t, err, lease.ErrNotAcquired, "a new reader is refused while the writer waits")
	hs, err := m1.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, lease.Shared, hs[0].Mode, "List shows only the reader: hence ListIntents")

	only, err := m1.ListIntents(ctx, &lease.ListOptions{Resource: "other"})
	require.NoError(t, err)
	assert.Empty(t, only, "filtered by resource")

	cancel()
	require.ErrorIs(t, <-done, lease.ErrNotAcquired)
	intents, err = m1.ListIntents(ctx, &lease.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	assert.Empty(t, intents, "a writer that gives up clears its intent")
}
