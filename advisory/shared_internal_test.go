package advisory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// An unlock on a shared holder connection that answers false means the record is wrong
// or the session was lost: the connection is in doubt. The unlocking lock gets
// ErrNotHeld; the connection is destroyed and every other lock on it is lost. The key is
// released behind the library's back, on the holder connection itself.
func TestSharedUnlockFindingAKeyNotHeldLosesTheHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	l, err := New(pool, Config{})
	require.NoError(t, err)
	v := pgtest.UniqueInt64(t)
	k1, k2 := keys.Int64(v), keys.Int64(v+1)
	h1, err := l.TryLock(ctx, k1, nil)
	require.NoError(t, err)
	h2, err := l.TryLock(ctx, k2, nil)
	require.NoError(t, err)
	hc, ok := h1.home.(*holderConn)
	require.True(t, ok, "a shared holder connection")
	require.Same(t, hc, h2.home)

	require.NoError(t, hc.take(ctx))
	var released bool
	require.NoError(t, hc.c.Conn().QueryRow(ctx, "SELECT pg_advisory_unlock($1)", v).Scan(&released))
	hc.give()
	require.True(t, released)

	require.ErrorIs(t, h1.Unlock(ctx), ErrNotHeld)
	assert.Equal(t, ErrUnlocked, h1.Err(), "Err after an Unlock that returned ErrNotHeld")
	select {
	case <-h2.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the other lock on the connection in doubt was not lost")
	}
	assert.ErrorIs(t, h2.Err(), ErrLockLost)
	assert.ErrorIs(t, h2.Unlock(ctx), ErrLockLost)
	assert.Zero(t, pool.Stat().AcquiredConns(), "destroyed")
	assert.Eventually(t, func() bool {
		var free bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)", v+1).Scan(&free))
		return free
	}, 10*time.Second, time.Millisecond, "the destroyed session's keys are free")
}
