package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Under exit_on_error (here the role's) a lock wait's 55P03 is FATAL: the
// server ends the session with it. The call fails with ErrLockTimeout and
// the 55P03 in its chain, at once: the session died of the call's own
// statement, not idle in the pool, so it is not retried on another
// connection (it was: within the spent bound that gave ErrNoConnection
// with no PgError, and with the role's lock_timeout alone it waited twice:
// review 25). No new connection is opened for the call.
func TestAWaitEndedByExitOnErrorIsALockTimeoutNotARetry(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	role := fmt.Sprintf("pgxlock_eoe_%d", pgtest.UniqueInt64(t)&0xffffffff)
	qrole := pgx.Identifier{role}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE ROLE "+qrole+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE "+qrole) })
	_, err = admin.Exec(ctx, "ALTER ROLE "+qrole+" SET exit_on_error = on")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER ROLE "+qrole+" SET lock_timeout = '300ms'")
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		opts *advisory.Options // Timeout -1 and no deadline: the role's lock_timeout bounds the wait
		call func(ctx context.Context, l *advisory.Locker, k keys.Key, o *advisory.Options) error
	}{
		{"WithLock, bounded", &advisory.Options{Timeout: 200 * time.Millisecond}, func(ctx context.Context, l *advisory.Locker, k keys.Key, o *advisory.Options) error {
			return l.WithLock(ctx, k, o, func(context.Context, *pgx.Conn) error { return nil })
		}},
		{"WithLock, the role's lock_timeout", &advisory.Options{Timeout: -1}, func(ctx context.Context, l *advisory.Locker, k keys.Key, o *advisory.Options) error {
			return l.WithLock(ctx, k, o, func(context.Context, *pgx.Conn) error { return nil })
		}},
		{"WithXactLock, bounded", &advisory.Options{Timeout: 200 * time.Millisecond}, func(ctx context.Context, l *advisory.Locker, k keys.Key, o *advisory.Options) error {
			return l.WithXactLock(ctx, k, o, func(context.Context, pgx.Tx) error { return nil })
		}},
		{"Lock, bounded", &advisory.Options{Timeout: 200 * time.Millisecond}, func(ctx context.Context, l *advisory.Locker, k keys.Key, o *advisory.Options) error {
			h, err := l.Lock(ctx, k, o)
			if err == nil {
				err = h.Unlock(ctx)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.User = role
			cfg.MaxConns = 4
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			require.NoError(t, tc.call(ctx, l, key(t), nil), "a free key: the pool has a live connection")
			k := key(t)
			other := hold(ctx, t, false, k)
			defer other.release()
			before := pool.Stat().NewConnsCount()
			cctx := ctx
			if tc.opts.Timeout < 0 {
				cctx = context.Background() // no deadline, which would bound the wait itself
			}
			err := tc.call(cctx, l, k, tc.opts)
			require.ErrorIs(t, err, advisory.ErrLockTimeout)
			assert.NotErrorIs(t, err, advisory.ErrNoConnection)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%v", err)
			assert.Equal(t, "55P03", pgErr.Code)
			assert.Equal(t, before, pool.Stat().NewConnsCount(), "no connection was drawn for a second wait")
		})
	}
}
