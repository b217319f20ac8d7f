package advisory_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// WithLock's doc: fn's error comes back unchanged when the lock was taken
// and released cleanly. Review 22: a reset that failed after the unlock had
// answered true (another session's pg_cancel_backend or
// pg_terminate_backend of the reset, a session statement_timeout that the
// reset outlasted) made the call fail as its unlock, matching no sentinel,
// or ErrLockLost, although the key was held until the unlock released it.
// The outcome is fn's (the connection is destroyed); an unlock that
// answered false is still ErrNotHeld. The lent code plants the reset's
// probe as a statement that waits for a key the test holds, so that the
// signal deterministically hits the reset after the unlock.
func TestAResetThatFailsAfterTheUnlockLeavesTheOutcomeToFn(t *testing.T) {
	for _, signal := range []string{"pg_cancel_backend", "pg_terminate_backend"} {
		for _, n := range []int{1, 2} {
			for _, selfUnlock := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/keys=%d/fnUnlocks=%v", signal, n, selfUnlock), func(t *testing.T) {
					ctx := testCtx(t)
					cfg := pgtest.Config(t)
					cfg.MaxConns = 1
					pool := pgtest.NewPool(t, cfg)
					l := newLocker(t, pool, advisory.Config{})
					admin := pgtest.Pool(t)
					ks := []keys.Key{key(t)}
					if n == 2 {
						ks = append(ks, key(t))
					}
					gate := key(t)
					g, _ := gate.Int64()
					h := hold(ctx, t, false, gate)
					// Warm: the connection's probe is prepared by its first lend.
					require.NoError(t, l.WithLockAll(ctx, ks, nil, func(context.Context, *pgx.Conn) error { return nil }))
					var pid atomic.Uint32
					done := make(chan error, 1)
					go func() {
						done <- l.WithLockAll(ctx, ks, nil, func(ctx context.Context, c *pgx.Conn) error {
							pid.Store(c.PgConn().PID())
							if selfUnlock {
								v, _ := ks[0].Int64()
								if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock($1)", v); err != nil {
									return err
								}
							}
							_, err := c.Exec(ctx, fmt.Sprintf("DEALLOCATE pgxlock_reset; PREPARE pgxlock_reset AS SELECT pg_advisory_lock(%d)", g), pgx.QueryExecModeSimpleProtocol)
							return err
						})
					}()
					awaitWaiting(ctx, t, admin, gate, 1) // the reset's probe, after the unlock
					for _, k := range ks[btoi(selfUnlock):] {
						assert.True(t, newProbe(t).free(ctx, k, false), "the unlock ran before the reset: %v is free", k)
					}
					_, err := admin.Exec(ctx, "SELECT "+signal+"($1)", int64(pid.Load()))
					require.NoError(t, err)
					err = <-done
					if selfUnlock {
						require.ErrorIs(t, err, advisory.ErrNotHeld, "fn unlocked a key itself")
					} else {
						require.NoError(t, err, "the keys were held until the unlock released them")
					}
					h.release()
					var next uint32
					require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&next))
					assert.NotEqual(t, pid.Load(), next, "the connection whose reset failed was destroyed")
				})
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Review 23: WithLockAll's unlock of several keys on a lent connection ran
// pgx's cached statements, which a callback's DEALLOCATE ALL or DISCARD ALL
// had removed from the server: the call failed with 26000, matching no
// sentinel (and, after DISCARD ALL, not ErrNotHeld although the keys had
// been dropped). The unlock is now one simple-protocol string of its own,
// as for one key.
func TestWithLockAllUnlocksAfterTheCallbackEmptiedTheStatementCache(t *testing.T) {
	ctx := testCtx(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec} {
		for _, shared := range []bool{false, true} {
			for _, fnSQL := range []string{"DEALLOCATE ALL", "DISCARD ALL", "SELECT 1"} {
				t.Run(fmt.Sprintf("%v/shared=%v/%s", mode, shared, fnSQL), func(t *testing.T) {
					cfg := pgtest.Config(t)
					cfg.MaxConns = 1
					cfg.ConnConfig.DefaultQueryExecMode = mode
					pool := pgtest.NewPool(t, cfg)
					l := newLocker(t, pool, advisory.Config{})
					ks := []keys.Key{key(t), key(t), keys.Pair(pgtest.UniqueInt32(t), 7)}
					opts := &advisory.Options{Shared: shared}
					noop := func(context.Context, *pgx.Conn) error { return nil }
					require.NoError(t, l.WithLockAll(ctx, ks, opts, noop)) // warms pgx's cache
					err := l.WithLockAll(ctx, ks, opts, func(ctx context.Context, c *pgx.Conn) error {
						_, err := c.Exec(ctx, fnSQL, pgx.QueryExecModeSimpleProtocol)
						return err
					})
					if fnSQL == "DISCARD ALL" {
						require.ErrorIs(t, err, advisory.ErrNotHeld, "the callback dropped the locks")
					} else {
						require.NoError(t, err)
					}
					for _, k := range ks {
						assert.True(t, newProbe(t).free(ctx, k, false), "%v is free", k)
					}
					require.NoError(t, l.WithLockAll(ctx, ks, opts, noop), "the pool works")
				})
			}
		}
	}
}

// Review 24: on a pool in pgx's simple protocol, WithLockAll's unlock of
// several keys went through pgx's batch, which pgx refuses to build once
// the callback left a client_encoding other than UTF8 or
// standard_conforming_strings off: a clean callback got an error and the
// connection was destroyed. There, as for one key, the unlock and the
// reset go as pooltx's string.
func TestWithLockAllInTheSimpleProtocolAfterTheCallbackChangedTheEncoding(t *testing.T) {
	ctx := testCtx(t)
	for _, set := range []string{"SET client_encoding = 'SJIS'", "SET standard_conforming_strings = off"} {
		t.Run(set, func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			pool := pgtest.NewPool(t, cfg)
			l := newLocker(t, pool, advisory.Config{})
			ks := []keys.Key{key(t), keys.Pair(pgtest.UniqueInt32(t), 3)}
			var pid uint32
			require.NoError(t, l.WithLockAll(ctx, ks, nil, func(ctx context.Context, c *pgx.Conn) error {
				pid = c.PgConn().PID()
				_, err := c.Exec(ctx, set)
				return err
			}))
			var next uint32
			var enc, scs string
			require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid(), current_setting('client_encoding'), current_setting('standard_conforming_strings')").Scan(&next, &enc, &scs))
			assert.Equal(t, pid, next, "reset, not destroyed")
			assert.Equal(t, [2]string{"UTF8", "on"}, [2]string{enc, scs})
			for _, k := range ks {
				assert.True(t, newProbe(t).free(ctx, k, false))
			}
		})
	}
}
