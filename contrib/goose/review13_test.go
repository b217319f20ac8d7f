package pgxlockgoose_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pgxlockgoose "github.com/pgxlock/pgxlock/contrib/goose"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Review round 13: a LockTimeout beyond lock_timeout's largest value (INT_MAX
// ms, about 24.8 days) made the lock statement fail with 22023 even on a
// free key, and destroyed the connection. It is cut to that value.
func TestSessionLockLongTimeoutIsCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, _ := openDB(t, 1)
	l, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(pgtest.UniqueInt64(t)), LockTimeout: 30 * 24 * time.Hour})
	require.NoError(t, err)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	// No deadline: the LockTimeout alone is the bound.
	require.NoError(t, l.SessionLock(context.Background(), conn), "a free key is granted")
	require.NoError(t, l.SessionUnlock(ctx, conn))

	// A context deadline beyond the maximum, with no LockTimeout.
	unbounded, err := pgxlockgoose.NewSessionLocker(pgxlockgoose.Config{Key: keys.Int64(pgtest.UniqueInt64(t)), LockTimeout: -1})
	require.NoError(t, err)
	far, cancelFar := context.WithTimeout(context.Background(), 40*24*time.Hour)
	defer cancelFar()
	require.NoError(t, conn.Close()) // the unlock closed its connection (SessionUnlock): take another
	conn2, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn2.Close()
	require.NoError(t, unbounded.SessionLock(far, conn2))
	require.NoError(t, unbounded.SessionUnlock(ctx, conn2))
}
