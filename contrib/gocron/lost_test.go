package pgxlockgocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// The README's Locker entry: the lock stops runs from overlapping while
// its session lives. When the holder's backend is terminated mid-run,
// another scheduler's Lock of the job succeeds while the first run goes
// on, and the first run's Unlock (whose error gocron ignores) matches
// advisory.ErrLockLost (review 31k).
func TestLockerAfterTheHoldersSessionDied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lockerOn := func() *pgxlockgocron.Locker {
		l, err := advisory.New(pgtest.NewPool(t, pgtest.Config(t)), advisory.Config{})
		require.NoError(t, err)
		jobs, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
		require.NoError(t, err)
		return jobs
	}
	first, second := lockerOn(), lockerOn()
	name := t.Name() + "-job"
	run, err := first.Lock(ctx, name)
	require.NoError(t, err)
	_, objid, _ := keys.Hash(name).PgLocks()
	admin := pgtest.Pool(t)
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objid = $1`, objid)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		other, err := second.Lock(ctx, name)
		if err != nil {
			return false
		}
		require.NoError(t, other.Unlock(ctx))
		return true
	}, 10*time.Second, 10*time.Millisecond, "another scheduler takes the job while the first run goes on")
	require.ErrorIs(t, run.Unlock(ctx), advisory.ErrLockLost)
}
