package lease_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// The crash test re-runs this test binary as a lease holder (TestHelperProcess
// with helperFormEnv set), waits until the database shows it holding and
// renewing, kills it with SIGKILL, and checks that the lease is taken over
// once the TTL has passed since its last renewal, with a larger token.
const (
	helperFormEnv   = "PGXLOCK_LEASE_HELPER_FORM" // "column" or "manager"
	helperSchemaEnv = "PGXLOCK_LEASE_HELPER_SCHEMA"
	// 3s, renewed every second: a helper process starved for over a second
	// on a loaded 2-core machine still renews in time (at 1s it did not).
	crashTTL   = 3 * time.Second
	crashOwner = "crash-helper"
)

// TestHelperProcess is not a test: it is the holder process of
// TestCrashedHolderIsTakenOver, and skips unless started by it.
func TestHelperProcess(t *testing.T) {
	form := os.Getenv(helperFormEnv)
	if form == "" {
		t.Skip("helper process for TestCrashedHolderIsTakenOver")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DSN(t)) // the parent set PGXLOCK_TEST_DATABASE
	if err != nil {
		t.Fatal(err)
	}
	schema := os.Getenv(helperSchemaEnv)
	hold := func(ctx context.Context) error {
		fmt.Println("holding") // for the log only; the parent watches the database
		<-ctx.Done()           // until killed, or the lease is lost
		return context.Cause(ctx)
	}
	switch form {
	case "column":
		c, err := lease.NewColumn(pool, crashColumnConfig(schema))
		if err == nil {
			err = c.TryDo(ctx, int64(1), nil, func(ctx context.Context, _ *lease.ColumnLease) error { return hold(ctx) })
		}
		t.Fatal(err)
	case "manager":
		m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: crashTTL, Owner: crashOwner})
		if err == nil {
			err = m.Do(ctx, "job", nil, func(ctx context.Context, _ *lease.Lease) error { return hold(ctx) })
		}
		t.Fatal(err)
	}
}

func crashColumnConfig(schema string) lease.ColumnConfig {
	return lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: crashTTL}
}

func TestCrashedHolderIsTakenOver(t *testing.T) {
	for _, form := range []string{"column", "manager"} {
		t.Run(form, func(t *testing.T) {
			p1, _, schema := twoPools(t)
			ctx := testCtx(t)
			// state returns the holder's token and the database time of its last
			// acquisition or renewal (zero values if nobody holds).
			var state func() (token int64, renewedAt time.Time)
			var takeOver func() (int64, time.Time)
			switch form {
			case "column":
				c := usersTable(t, p1, schema, crashTTL, 1)
				users := pgx.Identifier{schema, "users"}.Sanitize()
				state = func() (int64, time.Time) {
					var at *time.Time
					var token int64
					require.NoError(t, p1.QueryRow(ctx, "SELECT identity_action_fence, identity_action_locked_at FROM "+users+" WHERE id = 1").Scan(&token, &at))
					if at == nil {
						return 0, time.Time{}
					}
					return token, *at
				}
				takeOver = func() (int64, time.Time) {
					var l *lease.ColumnLease
					require.Eventually(t, func() bool { // the TTL has to pass
						var err error
						l, err = c.TryAcquire(ctx, int64(1))
						return err == nil
					}, 30*time.Second, 10*time.Millisecond)
					_, at := state()
					return l.Token(), at
				}
			case "manager":
				m := newManager(t, p1, schema, lease.ManagerConfig{TTL: crashTTL, PollInterval: 100 * time.Millisecond})
				state = func() (int64, time.Time) {
					hs, err := m.List(ctx, &lease.ListOptions{Owner: crashOwner, IncludeExpired: true})
					require.NoError(t, err)
					if len(hs) == 0 {
						return 0, time.Time{}
					}
					return hs[0].Token, hs[0].ExpiresAt.Add(-crashTTL)
				}
				takeOver = func() (int64, time.Time) {
					l, err := m.Acquire(ctx, "job", nil) // blocks until the lease expires
					require.NoError(t, err)
					return l.Token(), l.AcquiredAt()
				}
			}

			var stderr bytes.Buffer
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), helperFormEnv+"="+form, helperSchemaEnv+"="+schema, pgtest.EnvDatabase+"="+pgtest.DSN(t))
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			require.NoError(t, cmd.Start())
			killed := false
			t.Cleanup(func() {
				if !killed {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			})

			// Wait (database state) until the helper holds the lease and has
			// renewed it at least once: it is alive and keeping it.
			var token int64
			var first time.Time
			require.Eventually(t, func() bool {
				token, first = state()
				return token != 0
			}, 30*time.Second, 10*time.Millisecond, "the helper never acquired: %s", &stderr)
			require.Eventually(t, func() bool {
				_, at := state()
				return at.After(first)
			}, 30*time.Second, 10*time.Millisecond, "the helper never renewed: %s", &stderr)

			require.NoError(t, cmd.Process.Kill()) // SIGKILL: no deferred release runs
			_ = cmd.Wait()
			killed = true
			_, lastRenewal := state()

			newToken, takenAt := takeOver()
			t.Logf("taken over %v (database clock) after the holder's last renewal", takenAt.Sub(lastRenewal))
			assert.GreaterOrEqual(t, takenAt.Sub(lastRenewal), crashTTL, "not before the TTL")
			assert.Less(t, takenAt.Sub(lastRenewal), crashTTL+5*time.Second, "soon after the TTL")
			assert.Greater(t, newToken, token)
		})
	}
}
