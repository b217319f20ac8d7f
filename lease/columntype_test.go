package lease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// A table that was not through Migrate may have a locked-at column of a type
// that cannot hold the lease (a date truncates now() to the day: every
// acquirer would win). TryAcquire refuses it with ErrInvalid, claiming
// nothing, through domains too; timestamptz and timestamp, also through a
// domain, work.
func TestColumnTryAcquireRefusesALockedAtColumnOfTheWrongType(t *testing.T) {
	for _, tc := range []struct {
		name, typ string
		ok        bool
	}{
		{"date", "date", false},
		{"domain over date", "d_date", false},
		{"domain over a domain over date", "d_d_date", false},
		{"timestamptz", "timestamptz", true},
		{"timestamp(0)", "timestamp(0)", true},
		{"domain over timestamptz", "d_ts", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pgtest.Pool(t)
			schema := pgtest.Schema(t, p)
			ctx := testCtx(t)
			q := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
			mustExec(t, p, "CREATE DOMAIN "+q("d_date")+" AS date")
			mustExec(t, p, "CREATE DOMAIN "+q("d_d_date")+" AS "+q("d_date"))
			mustExec(t, p, "CREATE DOMAIN "+q("d_ts")+" AS timestamptz")
			typ := tc.typ
			if typ[0] == 'd' && typ != "date" {
				typ = q(typ)
			}
			mustExec(t, p, "CREATE TABLE "+q("jobs")+" (id int PRIMARY KEY, locked_at "+typ+", locked_by text, lock_fence bigint NOT NULL DEFAULT 0)")
			mustExec(t, p, "INSERT INTO "+q("jobs")+" (id) VALUES (1)")
			c, err := lease.NewColumn(p, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
			require.NoError(t, err)
			for range 2 { // the second call is not let through by the first
				l, err := c.TryAcquire(ctx, 1)
				if tc.ok {
					require.NoError(t, err)
					require.NoError(t, l.Release(ctx))
					continue
				}
				assert.Nil(t, l)
				require.ErrorIs(t, err, lease.ErrInvalid)
				assert.Contains(t, err.Error(), "not timestamptz or timestamp")
			}
			var claimed bool
			require.NoError(t, p.QueryRow(ctx, "SELECT locked_by IS NOT NULL FROM "+q("jobs")).Scan(&claimed))
			assert.False(t, claimed, "nothing was claimed")
		})
	}
}
