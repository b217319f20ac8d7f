package lease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// Issue 21 part 1: on a timestamptz(0) or timestamp(0) lock column the
// column rounds the assigned now() to the second, up to 0.5s either way; a
// lease stored rounded down was taken over up to 0.5s before its TTL, while
// the first holder's callback context was still live.
//
// The test keeps a ledger written by a trigger on the leased table, in the
// lease statements' own transactions: for every acquisition, renewal and
// release, the statement's now() and the fence (token). It then asserts on
// database times only: a takeover (an acquisition not preceded by a
// release) happens at least TTL after the previous holder's last
// acquisition or renewal, on every precision 0-6 of both types and with no
// precision, timestamp also under a non-UTC session TimeZone. And the Do
// holder's callback context is done before the next holder gets the row.
func TestOneHolderOnEveryTimestampPrecision(t *testing.T) {
	const ttl = 800 * time.Millisecond
	type config struct{ typ, tz string }
	var configs []config
	for _, typ := range []string{"timestamptz", "timestamp"} {
		configs = append(configs, config{typ, ""})
		for p := 0; p <= 6; p++ {
			configs = append(configs, config{fmt.Sprintf("%s(%d)", typ, p), ""})
		}
	}
	for _, typ := range []string{"timestamp(0)", "timestamp(3)", "timestamp", "timestamptz(0)"} {
		configs = append(configs, config{typ, "Asia/Kathmandu"}) // UTC+05:45
	}
	// Domains: "d0" is a domain over timestamptz(0), "dd0" a domain over d0.
	configs = append(configs, config{"d0", ""}, config{"dd0", ""})
	for _, cfg := range configs {
		name := cfg.typ
		if cfg.tz != "" {
			name += "/" + cfg.tz
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			newPool := func(maxConns int32) *pgxpool.Pool {
				pc := pgtest.Config(t)
				pc.MaxConns = maxConns
				if cfg.tz != "" {
					pc.ConnConfig.RuntimeParams["timezone"] = cfg.tz
				}
				return pgtest.NewPool(t, pc)
			}
			holderPool, takerPool := newPool(1), newPool(2)
			schema := pgtest.Schema(t, takerPool)
			jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
			ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
			fn := pgx.Identifier{schema, "log_lease"}.Sanitize()
			typ := cfg.typ
			if typ == "d0" || typ == "dd0" {
				d0, dd0 := pgx.Identifier{schema, "d0"}.Sanitize(), pgx.Identifier{schema, "dd0"}.Sanitize()
				mustExec(t, takerPool, "CREATE DOMAIN "+d0+" AS timestamptz(0)")
				mustExec(t, takerPool, "CREATE DOMAIN "+dd0+" AS "+d0)
				typ = pgx.Identifier{schema, typ}.Sanitize()
			}
			mustExec(t, takerPool, "CREATE TABLE "+jobs+" (id bigint PRIMARY KEY, locked_at "+typ+", locked_by text, lock_fence bigint NOT NULL DEFAULT 0)")
			mustExec(t, takerPool, "INSERT INTO "+jobs+" (id) VALUES (1), (2)")
			mustExec(t, takerPool, "CREATE TABLE "+ledger+" (seq bigserial PRIMARY KEY, id bigint, fence bigint, kind text, at timestamptz)")
			mustExec(t, takerPool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	INSERT INTO `+ledger+` (id, fence, kind, at) VALUES (NEW.id, NEW.lock_fence,
		CASE WHEN NEW.locked_at IS NULL THEN 'release'
			WHEN NEW.lock_fence IS DISTINCT FROM OLD.lock_fence THEN 'acquire' ELSE 'renew' END, now());
	RETURN NEW;
END $f$`)
			mustExec(t, takerPool, "CREATE TRIGGER log_lease BEFORE UPDATE ON "+jobs+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
			colCfg := lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: ttl}
			holder, err := lease.NewColumn(holderPool, colCfg)
			require.NoError(t, err)
			taker, err := lease.NewColumn(takerPool, colCfg)
			require.NoError(t, err)

			// steer starts the next statement early in a database second (a
			// fraction between from and to), so that precision 0 rounds it
			// down (the unsafe direction).
			steer := func(from, to float64) {
				for {
					var frac float64
					require.NoError(t, takerPool.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp())::numeric % 1").Scan(&frac))
					if frac > from && frac < to {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			// takeOver polls until the taker gets the row, then runs check.
			takeOver := func(id int64, check func()) *lease.ColumnLease {
				for {
					l, err := taker.TryAcquire(ctx, id)
					if err == nil {
						check()
						return l
					}
					require.ErrorIs(t, err, lease.ErrNotAcquired)
					time.Sleep(5 * time.Millisecond)
				}
			}

			// Row 1: a holder acquires, renews once, and stops: the takeover
			// is judged from the renewal.
			steer(0.05, 0.3)
			l, err := holder.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			time.Sleep(ttl / 4) // not a synchronisation: only spaces the renewal from the acquisition
			require.NoError(t, l.Renew(ctx))
			next := takeOver(1, func() {})
			require.NoError(t, next.Release(ctx))

			// Row 2: Do with default options, and a callback that keeps the
			// holder pool's only connection until its context ends, so that no
			// renewal gets through: the trust window closes, and the callback
			// must be cancelled before the row can be taken. Rounded down by
			// more than the margin (80ms), the row could be taken before.
			steer(0.2, 0.4)
			var cancelled atomic.Bool
			doErr := make(chan error, 1)
			started := make(chan struct{})
			go func() {
				doErr <- holder.TryDo(ctx, int64(2), nil, func(ctx context.Context, _ *lease.ColumnLease) error {
					c, err := holderPool.Acquire(ctx)
					close(started)
					if err == nil {
						<-ctx.Done()
						c.Release()
					}
					cancelled.Store(true)
					return nil
				})
			}()
			select {
			case <-started:
			case err := <-doErr:
				t.Fatalf("TryDo returned before its callback ran: %v", err)
			}
			next = takeOver(2, func() {
				assert.True(t, cancelled.Load(), "the next holder got the row while the callback's context was live")
			})
			require.NoError(t, next.Release(ctx))
			require.ErrorIs(t, <-doErr, lease.ErrLeaseLost, "the trust window closed")

			// The ledger, on database time only.
			rows, err := takerPool.Query(ctx, "SELECT id, fence, kind, at FROM "+ledger+" ORDER BY seq")
			require.NoError(t, err)
			type event struct {
				fence int64
				kind  string
				at    time.Time
			}
			last := map[int64]event{}
			takeovers := 0
			for rows.Next() {
				var id int64
				var e event
				require.NoError(t, rows.Scan(&id, &e.fence, &e.kind, &e.at))
				prev, seen := last[id]
				if e.kind == "acquire" && seen && prev.kind != "release" {
					takeovers++
					assert.GreaterOrEqual(t, e.at.Sub(prev.at), ttl,
						"row %d: token %d taken over %v after token %d's last %s (TTL %v)", id, e.fence, e.at.Sub(prev.at), prev.fence, prev.kind, ttl)
				}
				last[id] = e
			}
			require.NoError(t, rows.Err())
			assert.GreaterOrEqual(t, takeovers, 1, "row 1 was taken over")
		})
	}
}

// Issue 21 part 1: Column.Migrate accepted existing lock columns whatever
// their types. Every precision of timestamptz and timestamp is now safe; a
// locked-at column of another type (a date truncates now() to the day) is
// refused with ErrInvalid, through domains too.
func TestColumnMigrateRefusesNonTimestampLockedAt(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	mustExec(t, pool, "CREATE DOMAIN "+q("day")+" AS date")
	mustExec(t, pool, "CREATE DOMAIN "+q("ts2")+" AS timestamp(2)")
	mustExec(t, pool, "CREATE DOMAIN "+q("ts2b")+" AS "+q("ts2"))
	for i, c := range []struct {
		typ string
		ok  bool
	}{
		{"timestamptz(0)", true}, {"timestamp(0)", true}, {"timestamptz", true}, {q("ts2b"), true},
		{"date", false}, {"text", false}, {"bigint", false}, {q("day"), false},
	} {
		table := fmt.Sprintf("t%d", i)
		mustExec(t, pool, "CREATE TABLE "+q(table)+" (id bigint PRIMARY KEY, locked_at "+c.typ+", locked_by text, lock_fence bigint NOT NULL DEFAULT 0)")
		col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: table, TTL: time.Minute})
		require.NoError(t, err)
		err = col.Migrate(ctx)
		if c.ok {
			assert.NoError(t, err, c.typ)
		} else {
			assert.ErrorIs(t, err, lease.ErrInvalid, c.typ)
		}
	}
	// A table without the columns gets them, and passes.
	mustExec(t, pool, "CREATE TABLE "+q("bare")+" (id bigint PRIMARY KEY)")
	col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "bare", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, col.Migrate(ctx))
}

// The column statements, with their precision pad and token match, work in
// every pgx QueryExecMode, on a timestamptz(0) column with a uuid owner.
func TestColumnLeaseEveryQueryExecMode(t *testing.T) {
	ctx := testCtx(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pgtest.Config(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool := pgtest.NewPool(t, cfg)
			schema := pgtest.Schema(t, pool)
			jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
			mustExec(t, pool, "CREATE TABLE "+jobs+" (id bigint PRIMARY KEY, locked_at timestamptz(0), locked_by uuid, lock_fence bigint NOT NULL DEFAULT 0)")
			mustExec(t, pool, "INSERT INTO "+jobs+" (id) VALUES (1)")
			col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "jobs", TTL: time.Minute})
			require.NoError(t, err)
			require.NoError(t, col.Migrate(ctx))
			l, err := col.TryAcquire(ctx, int64(1))
			require.NoError(t, err)
			_, err = col.TryAcquire(ctx, int64(1))
			require.ErrorIs(t, err, lease.ErrNotAcquired)
			require.NoError(t, l.Renew(ctx))
			forged := l.Ref()
			forged.Token++
			fl, err := col.Resume(forged)
			require.NoError(t, err)
			require.ErrorIs(t, fl.Renew(ctx), lease.ErrLeaseLost)
			require.NoError(t, l.Release(ctx))
		})
	}
}
