package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 2: under default_transaction_isolation = serializable (or
// repeatable read), racing lease statements surfaced SQLSTATE 40001 instead
// of ErrNotAcquired, and blocking Do calls failed outright. The lease
// statements now run READ COMMITTED whatever the session default: no
// serialization failure may reach the caller.
func TestSessionIsolationLevelNeverSurfaces40001(t *testing.T) {
	const goroutines, tries = 10, 30
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			cfg.MaxConns = 6
			pool := pgtest.NewPool(t, cfg)
			require.Equal(t, level, queryOne[string](t, pool, "SHOW default_transaction_isolation"))
			schema := pgtest.Schema(t, pool)
			ctx := testCtx(t)
			col := usersTable(t, pool, schema, time.Minute, 1)
			m := newManager(t, pool, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 50 * time.Millisecond})

			// race runs goroutines x tries attempts and fails on any error
			// other than ErrNotAcquired, naming a 40001 when it sees one.
			race := func(t *testing.T, try func() (release func() error, err error)) {
				var wg sync.WaitGroup
				var mu sync.Mutex
				var unexpected []error
				granted := 0
				for range goroutines {
					wg.Go(func() {
						for range tries {
							release, err := try()
							if err == nil {
								err = release()
							}
							mu.Lock()
							switch {
							case err == nil:
								granted++
							case !errors.Is(err, lease.ErrNotAcquired):
								unexpected = append(unexpected, err)
							}
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				for _, err := range unexpected {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "40001" {
						t.Errorf("serialization failure reached the caller: %v", err)
					} else {
						t.Errorf("unexpected error: %v", err)
					}
				}
				assert.NotZero(t, granted)
				t.Logf("%d of %d attempts granted, %d unexpected errors", granted, goroutines*tries, len(unexpected))
			}
			t.Run("column", func(t *testing.T) {
				race(t, func() (func() error, error) {
					l, err := col.TryAcquire(ctx, int64(1))
					if err != nil {
						return nil, err
					}
					return func() error { return l.Release(ctx) }, nil
				})
			})
			t.Run("manager", func(t *testing.T) {
				race(t, func() (func() error, error) {
					l, err := m.TryAcquire(ctx, "r", nil)
					if err != nil {
						return nil, err
					}
					return func() error { return l.Release(ctx) }, nil
				})
			})
			t.Run("blocking Do", func(t *testing.T) {
				var wg sync.WaitGroup
				errs := make([]error, goroutines)
				for i := range goroutines {
					wg.Go(func() {
						errs[i] = m.Do(ctx, "do", nil, func(ctx context.Context, l *lease.Lease) error { return nil })
					})
				}
				wg.Wait()
				for _, err := range errs {
					assert.NoError(t, err)
				}
			})
		})
	}
}
