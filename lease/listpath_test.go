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

// The package doc: List and ListIntents name their functions, casts and operators in
// pg_catalog, so a schema ahead of pg_catalog on the session's search_path, holding
// look-alike comparisons of timestamptz and text (CVE-2018-1058's pattern), cannot hide
// a live lease or show it expired. Their comparisons were bare (review 21): with such a
// schema first on the path, List returned no holder, and List(IncludeExpired) showed the
// live lease expired, in every exec mode.
func TestListIgnoresLookAlikeOperatorsOnTheSearchPath(t *testing.T) {
	ctx := testCtx(t)
	admin := pgtest.Pool(t)
	evil := pgtest.Schema(t, admin)
	q := pgx.Identifier{evil}.Sanitize()
	mustExec(t, admin, `
CREATE FUNCTION `+q+`.ts_le(timestamptz, timestamptz) RETURNS bool LANGUAGE sql AS $$ SELECT true $$;
CREATE FUNCTION `+q+`.ts_gt(timestamptz, timestamptz) RETURNS bool LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION `+q+`.text_eq(text, text) RETURNS bool LANGUAGE sql AS $$ SELECT false $$;
CREATE OPERATOR `+q+`.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = `+q+`.ts_le);
CREATE OPERATOR `+q+`.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = `+q+`.ts_gt);
CREATE OPERATOR `+q+`.= (LEFTARG = text, RIGHTARG = text, FUNCTION = `+q+`.text_eq)`)
	schema := pgtest.Schema(t, admin)
	// Migrated under a plain search_path (Migrate under the hostile one has its own
	// test: TestMigrateIgnoresLookAlikesOnTheSearchPath).
	clean, err := lease.NewManager(admin, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, clean.Migrate(ctx))
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.RuntimeParams["search_path"] = evil + ", pg_catalog, public"
			pool := pgtest.NewPool(t, cfg)
			m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, TTL: time.Minute})
			require.NoError(t, err)
			l, err := m.TryAcquire(ctx, "r-"+mode.String(), nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, l.Release(ctx)) }()
			for _, opts := range []*lease.ListOptions{{Resource: l.Resource()}, {Resource: l.Resource(), IncludeExpired: true}} {
				hs, err := m.List(ctx, opts)
				require.NoError(t, err)
				if assert.Len(t, hs, 1, "%+v", opts) {
					assert.False(t, hs[0].Expired, "%+v: the lease is live", opts)
					assert.Equal(t, l.Token(), hs[0].Token)
				}
			}
		})
	}
}
