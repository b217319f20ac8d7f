package pgxlockgocron_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// The package doc's caveat: a job's lock that this process holds is learnt
// busy on a second connection; with none free in the pool, the attempt
// waits up to the Locker's LockTimeout and fails with ErrNoConnection (not
// ErrNotAcquired), and no second run begins. With a connection free, it is
// ErrNotAcquired at once.
func TestLockerOnAFullPoolReportsNoConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, size := range []int32{1, 2} {
		cfg := pgtest.Config(t)
		cfg.MaxConns = size
		pool := pgtest.NewPool(t, cfg)
		l, err := advisory.New(pool, advisory.Config{LockTimeout: 200 * time.Millisecond})
		require.NoError(t, err)
		jobs, err := pgxlockgocron.NewLocker(l, pgxlockgocron.Config{})
		require.NoError(t, err)
		name := t.Name() + "-job"
		first, err := jobs.Lock(ctx, name)
		require.NoError(t, err)
		_, err = jobs.Lock(ctx, name)
		if size == 1 {
			assert.ErrorIs(t, err, advisory.ErrNoConnection, "pool of %d", size)
			assert.NotErrorIs(t, err, advisory.ErrNotAcquired)
		} else {
			assert.ErrorIs(t, err, advisory.ErrNotAcquired, "pool of %d", size)
		}
		require.NoError(t, first.Unlock(ctx))
	}
}
