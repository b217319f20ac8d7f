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

// Migrate refuses lock-manager tables whose time columns were altered to a
// type that misjudges expiry (timestamptz(0) rounds expires_at by up to half
// a second: a 1s lease was taken over 538 ms after its acquisition), and
// accepts timestamptz(6), which is full precision.
func TestManagerMigrateRefusesTimeColumnsOfReducedPrecision(t *testing.T) {
	for _, tc := range []struct {
		table, column, typ string
		ok                 bool
	}{
		{"pgxlock_leases", "expires_at", "timestamptz(0)", false},
		{"pgxlock_leases", "acquired_at", "timestamptz(3)", false},
		{"pgxlock_leases", "expires_at", "timestamp", false},
		{"pgxlock_leases_resources", "writer_intent_until", "timestamptz(0)", false},
		{"pgxlock_leases", "expires_at", "timestamptz(6)", true},
	} {
		t.Run(tc.column+" "+tc.typ, func(t *testing.T) {
			p := pgtest.Pool(t)
			schema := pgtest.Schema(t, p)
			ctx := testCtx(t)
			m := newManager(t, p, schema, lease.ManagerConfig{TTL: time.Second})
			mustExec(t, p, "ALTER TABLE "+pgx.Identifier{schema, tc.table}.Sanitize()+" ALTER "+tc.column+" TYPE "+tc.typ)
			err := m.Migrate(ctx)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, lease.ErrInvalid)
			assert.Contains(t, err.Error(), `column "`+tc.column+`"`)
		})
	}
}
