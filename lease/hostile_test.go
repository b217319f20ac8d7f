package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// hostileStrings are resource names, ids and owners that would break SQL
// built by concatenation. canary is the qualified name of a table they try
// to drop.
func hostileStrings(canary string) []string {
	return []string{
		"'; DROP TABLE " + canary + "; --",
		`"; DROP TABLE ` + canary + `; --`,
		"x' OR '1'='1",
		"-- just a comment",
		"/* unterminated",
		"$1 $2 ::interval",
		"semi;colon;",
		"back\\slash\\",
		"new\nline\ttab",
		"ünïcødé ☃ 日本語 🔒",
		"\u202eright-to-left",
		strings.Repeat("é", lease.MaxResourceLen/2), // exactly MaxResourceLen bytes
	}
}

func TestHostileIdentifiersAndValues(t *testing.T) {
	p1, p2, _ := twoPools(t)
	ctx := testCtx(t)
	// A schema, table and columns named to break naive quoting.
	schema := fmt.Sprintf(`we"ird; schema -- ☃ %x`, uint64(pgtest.UniqueInt64(t)))
	mustExec(t, p1, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := p1.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		assert.NoError(t, err)
	})
	canary := pgx.Identifier{schema, "canary"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+canary+" (alive bool)")
	mustExec(t, p1, "INSERT INTO "+canary+" VALUES (true)")
	hostile := hostileStrings(canary)

	t.Run("column", func(t *testing.T) {
		const table, idCol, atCol, byCol, fenceCol = `ta"ble; DROP TABLE x; --`, `i"d`, "lockéd at ☃", `own"er--`, "fen;ce"
		q := pgx.Identifier{schema, table}.Sanitize()
		mustExec(t, p1, "CREATE TABLE "+q+" ("+pgx.Identifier{idCol}.Sanitize()+" text PRIMARY KEY)")
		cfg := lease.ColumnConfig{Schema: schema, Table: table, IDColumn: idCol, LockedAtColumn: atCol,
			OwnerColumn: byCol, FenceColumn: fenceCol, TTL: time.Minute}
		c1, err := lease.NewColumn(p1, cfg)
		require.NoError(t, err)
		c2, err := lease.NewColumn(p2, cfg)
		require.NoError(t, err)
		require.NoError(t, c1.Migrate(ctx))
		require.NoError(t, c1.Migrate(ctx), "idempotent")
		for _, id := range hostile {
			mustExec(t, p1, "INSERT INTO "+q+" VALUES ($1)", id)
		}
		for _, id := range hostile {
			l, err := c1.TryAcquire(ctx, id)
			require.NoError(t, err, "%q", id)
			_, err = c2.TryAcquire(ctx, id)
			require.ErrorIs(t, err, lease.ErrNotAcquired, "%q", id)
			require.NoError(t, l.Renew(ctx), "%q", id)
			require.NoError(t, l.Release(ctx), "%q", id)
		}
		_, err = c1.TryAcquire(ctx, "not there")
		require.ErrorIs(t, err, lease.ErrNotFound)
		assert.Equal(t, len(hostile), queryOne[int](t, p1, "SELECT count(*) FROM "+q+" WHERE "+pgx.Identifier{fenceCol}.Sanitize()+" = 1"),
			"each row was acquired exactly once")
	})

	t.Run("manager", func(t *testing.T) {
		cfg := lease.ManagerConfig{Schema: schema, Table: `lo"cks; --ü`, TTL: time.Minute,
			Owner: `own"er'; --`, Channel: `ch"an nel; --`, PollInterval: time.Hour}
		m1 := newManager(t, p1, schema, cfg)
		m2 := newManager(t, p2, schema, cfg)
		require.NoError(t, m1.Migrate(ctx), "idempotent")
		resources := pgx.Identifier{schema, cfg.Table + "_resources"}.Sanitize()
		meta := json.RawMessage(`{"note": "'; DROP TABLE x; --", "q": "\"", "u": "☃"}`)
		for _, r := range hostile {
			// Shared, so that the blocked writer below stores its intent
			// (a writer blocked by a writer stores none).
			l, err := m1.TryAcquire(ctx, r, &lease.AcquireOptions{Metadata: meta, Mode: lease.Shared})
			require.NoError(t, err, "%q", r)
			// A blocking waiter on the other pool must be woken by NOTIFY (the
			// poll interval is an hour), whatever the resource name.
			got := make(chan error, 1)
			go func() {
				w, err := m2.Acquire(ctx, r, &lease.AcquireOptions{Owner: r})
				if err == nil {
					err = w.Release(ctx)
				}
				got <- err
			}()
			// Release only once the waiter is parked (its writer intent is
			// stored), so that the wake-up has to come through NOTIFY.
			require.Eventually(t, func() bool {
				return queryOne[bool](t, p1, "SELECT writer_intent IS NOT NULL FROM "+resources+" WHERE resource = $1", r)
			}, 10*time.Second, 5*time.Millisecond)
			hs, err := m2.List(ctx, &lease.ListOptions{Resource: r})
			require.NoError(t, err)
			require.Len(t, hs, 1, "%q", r)
			assert.Equal(t, r, hs[0].Resource)
			assert.Equal(t, cfg.Owner, hs[0].Owner)
			assert.JSONEq(t, string(meta), string(hs[0].Metadata))
			require.NoError(t, l.Renew(ctx), "%q", r)
			require.NoError(t, l.Release(ctx), "%q", r)
			require.NoError(t, <-got, "%q", r)
		}
		n, err := m1.ReleaseAll(ctx, hostile[0])
		require.NoError(t, err)
		assert.Zero(t, n)
		_, err = m1.Sweep(ctx)
		require.NoError(t, err)
	})

	t.Run("fence", func(t *testing.T) {
		const table, keyCol, tokenCol, dataCol = `pro"tected; --`, "k€y", `to"ken`, `da ta"; --`
		q := pgx.Identifier{schema, table}.Sanitize()
		mustExec(t, p1, "CREATE TABLE "+q+" ("+pgx.Identifier{keyCol}.Sanitize()+" text PRIMARY KEY, "+
			pgx.Identifier{tokenCol}.Sanitize()+" bigint NOT NULL DEFAULT 0, "+pgx.Identifier{dataCol}.Sanitize()+" text)")
		f, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: table, KeyColumn: keyCol, TokenColumn: tokenCol})
		require.NoError(t, err)
		for _, k := range hostile {
			mustExec(t, p1, "INSERT INTO "+q+" ("+pgx.Identifier{keyCol}.Sanitize()+") VALUES ($1)", k)
			require.NoError(t, f.Update(ctx, p1, k, 5, map[string]any{dataCol: k}))
			require.ErrorIs(t, f.Update(ctx, p2, k, 4, map[string]any{dataCol: "stale"}), lease.ErrLeaseLost)
		}
		_, err = lease.NewFence(lease.FenceConfig{Table: "t\x00"})
		require.ErrorIs(t, err, lease.ErrInvalid)
		require.ErrorIs(t, f.Update(ctx, p1, "k", 1, map[string]any{"bad\x00col": 1}), lease.ErrInvalid)
	})

	assert.True(t, queryOne[bool](t, p1, "SELECT alive FROM "+canary), "the canary survived")
}
