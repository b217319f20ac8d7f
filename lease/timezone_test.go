package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// zonePool returns a pool whose sessions use the given TimeZone.
func zonePool(t *testing.T, zone string) *pgxpool.Pool {
	cfg := pgtest.Config(t)
	cfg.ConnConfig.RuntimeParams["timezone"] = zone
	return pgtest.NewPool(t, cfg)
}

// Issue 11 item 1: with a `timestamp` (without time zone) locked-at column,
// sessions in different TimeZones disagreed by hours about whether a lease
// was live: a UTC session took over a live lease taken from Sao Paulo (two
// holders), and a Sao Paulo session could not take over an expired one taken
// from UTC. Every pair of zones must agree, for both column types.
func TestColumnLeaseAgreesAcrossTimeZones(t *testing.T) {
	zones := []string{"UTC", "America/Sao_Paulo", "Asia/Tokyo"}
	pools := map[string]*pgxpool.Pool{}
	for _, z := range zones {
		pools[z] = zonePool(t, z)
	}
	plain := pools["UTC"]
	for _, typ := range []string{"timestamp", "timestamptz"} {
		t.Run(typ, func(t *testing.T) {
			ctx := testCtx(t)
			schema := pgtest.Schema(t, plain)
			table := pgx.Identifier{schema, "users"}.Sanitize()
			mustExec(t, plain, "CREATE TABLE "+table+" (id bigint PRIMARY KEY, locked_at "+typ+
				", locked_by text, lock_fence bigint NOT NULL DEFAULT 0)")
			mustExec(t, plain, "INSERT INTO "+table+" (id) VALUES (1)")
			cols := map[string]*lease.Column{}
			for z, p := range pools {
				c, err := lease.NewColumn(p, lease.ColumnConfig{Schema: schema, Table: "users", TTL: time.Minute})
				require.NoError(t, err)
				require.NoError(t, c.Migrate(ctx), "Migrate accepts a %s column", typ)
				cols[z] = c
			}
			for _, a := range zones {
				for _, b := range zones {
					if a == b {
						continue
					}
					name := fmt.Sprintf("%s then %s", a, b)
					held, err := cols[a].TryAcquire(ctx, int64(1))
					require.NoError(t, err, name)
					_, err = cols[b].TryAcquire(ctx, int64(1))
					require.ErrorIs(t, err, lease.ErrNotAcquired, "%s: a live lease taken in one zone is live in the other", name)

					// Age the lease past its TTL by the column's own arithmetic.
					mustExec(t, plain, "UPDATE "+table+" SET locked_at = locked_at - interval '2 minutes' WHERE id = 1")
					next, err := cols[b].TryAcquire(ctx, int64(1))
					require.NoError(t, err, "%s: an expired lease taken in one zone is expired in the other", name)
					require.Greater(t, next.Token(), held.Token())
					require.ErrorIs(t, held.Release(ctx), lease.ErrLeaseLost)
					require.NoError(t, next.Release(ctx))
				}
			}
		})
	}
}
