package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// ledger records critical sections in SQL, from the holders' own pools:
//   - occupancy has one row: the writer inside (if any) and the number of
//     readers inside. Entering is a conditional UPDATE that must match, so
//     two holders inside at once fail deterministically, not by luck;
//   - entries logs enter/exit events with the fencing token, in sequence
//     order, to check alternation and token order afterwards.
type ledger struct {
	occupancy, entries string
}

func newLedger(t *testing.T, pool *pgxpool.Pool, schema string) ledger {
	l := ledger{
		occupancy: pgx.Identifier{schema, "occupancy"}.Sanitize(),
		entries:   pgx.Identifier{schema, "entries"}.Sanitize(),
	}
	mustExec(t, pool, "CREATE TABLE "+l.occupancy+" (id int PRIMARY KEY, writer int, readers int NOT NULL DEFAULT 0, max_readers int NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+l.occupancy+" (id) VALUES (1)")
	mustExec(t, pool, "CREATE TABLE "+l.entries+" (seq bigserial PRIMARY KEY, who int NOT NULL, event text NOT NULL, token bigint NOT NULL)")
	return l
}

// enter marks a writer (or reader) inside; it fails if the section is not
// free for it.
func (l ledger) enter(ctx context.Context, pool *pgxpool.Pool, who int, token int64, reader bool) error {
	cond := "writer IS NULL AND readers = 0"
	set := "writer = $1"
	if reader {
		cond, set = "writer IS NULL", "readers = readers + 1, max_readers = greatest(max_readers, readers + 1)"
	}
	tag, err := pool.Exec(ctx, `
WITH o AS (UPDATE `+l.occupancy+` SET `+set+` WHERE id = 1 AND `+cond+` RETURNING 1)
INSERT INTO `+l.entries+` (who, event, token) SELECT $1, 'enter', $2 FROM o`, who, token)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("holder %d (token %d, reader=%v) found the section occupied", who, token, reader)
	}
	return err
}

func (l ledger) exit(ctx context.Context, pool *pgxpool.Pool, who int, token int64, reader bool) error {
	cond, set := "writer = $1", "writer = NULL"
	if reader {
		cond, set = "readers > 0", "readers = readers - 1"
	}
	tag, err := pool.Exec(ctx, `
WITH o AS (UPDATE `+l.occupancy+` SET `+set+` WHERE id = 1 AND `+cond+` RETURNING 1)
INSERT INTO `+l.entries+` (who, event, token) SELECT $1, 'exit', $2 FROM o`, who, token)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("holder %d (token %d) could not leave the section", who, token)
	}
	return err
}

// checkExclusive verifies the entries of exclusive sections: strictly
// alternating enter/exit by the same holder, tokens strictly increasing.
func (l ledger) checkExclusive(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	rows, err := pool.Query(testCtx(t), "SELECT who, event, token FROM "+l.entries+" ORDER BY seq")
	require.NoError(t, err)
	type entry struct {
		Who   int
		Event string
		Token int64
	}
	es, err := pgx.CollectRows(rows, pgx.RowToStructByPos[entry])
	require.NoError(t, err)
	require.Len(t, es, 2*want)
	last := int64(0)
	for i := 0; i < len(es); i += 2 {
		in, out := es[i], es[i+1]
		require.Equal(t, "enter", in.Event, "entry %d", i)
		require.Equal(t, "exit", out.Event, "entry %d", i+1)
		require.Equal(t, in.Who, out.Who, "entry %d: another holder left", i+1)
		require.Greater(t, in.Token, last, "entry %d: fencing token did not increase", i)
		last = in.Token
	}
}

// exclusiveHolder is the contended resource, as either lease form.
type exclusiveHolder func(ctx context.Context, who int, pool *pgxpool.Pool) (token int64, release func() error, err error)

func TestContentionExclusive(t *testing.T) {
	const goroutines, rounds = 32, 5
	run := func(t *testing.T, p1, p2 *pgxpool.Pool, l ledger, acquire exclusiveHolder) {
		ctx := testCtx(t)
		var inside atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 2*goroutines*rounds) // room for every error a goroutine may send
		for who := range goroutines {
			pool := []*pgxpool.Pool{p1, p2}[who%2]
			wg.Go(func() {
				for range rounds {
					token, release, err := acquire(ctx, who, pool)
					if err != nil {
						errs <- err
						return
					}
					if n := inside.Add(1); n != 1 {
						errs <- fmt.Errorf("%d holders at once in process", n)
					}
					err = errors.Join(l.enter(ctx, pool, who, token, false), l.exit(ctx, pool, who, token, false))
					inside.Add(-1)
					if err = errors.Join(err, release()); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		l.checkExclusive(t, p1, goroutines*rounds)
	}

	t.Run("column", func(t *testing.T) {
		p1, p2, schema := twoPools(t)
		l := newLedger(t, p1, schema)
		cols := []*lease.Column{usersTable(t, p1, schema, time.Minute, 1), nil}
		var err error
		cols[1], err = lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
			OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: time.Minute})
		require.NoError(t, err)
		attempts := atomic.Int64{}
		run(t, p1, p2, l, func(ctx context.Context, who int, pool *pgxpool.Pool) (int64, func() error, error) {
			c := cols[who%2]
			for {
				attempts.Add(1)
				cl, err := c.TryAcquire(ctx, int64(1))
				if err == nil {
					return cl.Token(), func() error { return cl.Release(ctx) }, nil
				}
				if !errors.Is(err, lease.ErrNotAcquired) {
					return 0, nil, err
				}
				time.Sleep(rand.N(2 * time.Millisecond)) // back-off between tries, not synchronisation
			}
		})
		t.Logf("%d acquisitions took %d attempts", goroutines*rounds, attempts.Load())
	})

	t.Run("manager", func(t *testing.T) {
		p1, p2, schema := twoPools(t)
		l := newLedger(t, p1, schema)
		ms := []*lease.Manager{
			newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute}),
			newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute}),
		}
		run(t, p1, p2, l, func(ctx context.Context, who int, pool *pgxpool.Pool) (int64, func() error, error) {
			ml, err := ms[who%2].Acquire(ctx, "the-resource", nil)
			if err != nil {
				return 0, nil, err
			}
			return ml.Token(), func() error { return ml.Release(ctx) }, nil
		})
		assert.Zero(t, p1.Stat().AcquiredConns())
		assert.Zero(t, p2.Stat().AcquiredConns())
	})
}

// Readers share, a writer is alone, across 32 goroutines on two pools.
func TestContentionSharedAndExclusive(t *testing.T) {
	const readers, writers, rounds = 24, 8, 4
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	l := newLedger(t, p1, schema)
	ms := []*lease.Manager{
		newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 200 * time.Millisecond}),
		newManager(t, p2, schema, lease.ManagerConfig{TTL: time.Minute, PollInterval: 200 * time.Millisecond}),
	}
	var wg sync.WaitGroup
	errs := make(chan error, readers+writers)
	for who := range readers + writers {
		reader := who < readers
		pool, m := []*pgxpool.Pool{p1, p2}[who%2], ms[who%2]
		opts := &lease.AcquireOptions{Mode: lease.Exclusive}
		if reader {
			opts.Mode = lease.Shared
		}
		wg.Go(func() {
			for range rounds {
				err := m.Do(ctx, "doc", &lease.DoOptions{Acquire: opts}, func(ctx context.Context, ml *lease.Lease) error {
					if err := l.enter(ctx, pool, who, ml.Token(), reader); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.N(5)+1) * time.Millisecond) // work, so that readers overlap
					return l.exit(ctx, pool, who, ml.Token(), reader)
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	maxReaders := queryOne[int](t, p1, "SELECT max_readers FROM "+l.occupancy)
	t.Logf("at most %d readers were inside together", maxReaders)
	assert.Greater(t, maxReaders, 1, "readers shared the resource")
	assert.Equal(t, (readers+writers)*rounds, queryOne[int](t, p1, "SELECT count(*) FROM "+l.entries+" WHERE event = 'enter'"))
}

// The writer-preference policy: a continuous stream of overlapping readers
// does not keep a blocking writer out. Once the writer's intent is stored,
// new readers queue behind it, and the writer gets in when the readers
// already inside leave.
func TestContentionWriterNotStarved(t *testing.T) {
	const readers = 8
	const hold = 30 * time.Millisecond
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	// A long poll interval gives the intent a long life (3 intervals) even on
	// a loaded machine; wake-ups come from the readers' releases anyway.
	cfg := lease.ManagerConfig{TTL: time.Minute, PollInterval: time.Second}
	ms := []*lease.Manager{newManager(t, p1, schema, cfg), newManager(t, p2, schema, cfg)}
	resources := pgx.Identifier{schema, lease.DefaultTable + "_resources"}.Sanitize()
	// Observe the policy in the database: log the fence value each time the
	// writer intent changes.
	intentLog := pgx.Identifier{schema, "intent_log"}.Sanitize()
	logFn := pgx.Identifier{schema, "log_intent"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+intentLog+" (seq bigserial PRIMARY KEY, fence bigint NOT NULL, intent text)")
	mustExec(t, p1, "CREATE FUNCTION "+logFn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO "+intentLog+
		" (fence, intent) VALUES (NEW.fence, NEW.writer_intent); RETURN NEW; END $$")
	mustExec(t, p1, "CREATE TRIGGER log_intent AFTER UPDATE ON "+resources+
		" FOR EACH ROW WHEN (NEW.writer_intent IS DISTINCT FROM OLD.writer_intent) EXECUTE FUNCTION "+logFn+"()")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var readerGrants atomic.Int64
	errs := make(chan error, readers)
	for who := range readers {
		m := ms[who%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rl, err := m.Acquire(ctx, "doc", &lease.AcquireOptions{Mode: lease.Shared})
				if err != nil {
					errs <- err
					return
				}
				readerGrants.Add(1)
				time.Sleep(hold) // reading; the holds overlap, so some reader is always inside
				if err := rl.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Wait until the readers are streaming (database state: shared leases exist).
	require.Eventually(t, func() bool {
		hs, err := ms[0].List(ctx, &lease.ListOptions{Resource: "doc"})
		require.NoError(t, err)
		return len(hs) >= readers/2
	}, 10*time.Second, 5*time.Millisecond)

	fenceBefore := queryOne[int64](t, p1, "SELECT fence FROM "+resources+" WHERE resource = 'doc'")
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := ms[1].Acquire(wctx, "doc", nil)
	require.NoError(t, err, "the writer was starved")
	waited := time.Since(start)
	hs, err := ms[0].List(ctx, &lease.ListOptions{Resource: "doc"})
	require.NoError(t, err)
	require.Len(t, hs, 1, "the writer is alone")
	require.NoError(t, w.Release(ctx))
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Readers granted between the writer's first attempt and its grant: only
	// those that raced the intent's registration (each reader holds for 30ms,
	// so it can slip in at most about once), never an unbounded stream.
	slipped := w.Token() - fenceBefore - 1
	t.Logf("writer waited %v behind %d readers; %d reader grants came between its first attempt and its grant; %d reader grants in all",
		waited, readers, slipped, readerGrants.Load())
	assert.Less(t, waited, 5*time.Second)

	// The policy itself: from the moment the intent was stored (at fence F),
	// no reader was granted before the writer, whose token is therefore F+1.
	// The intent was set once and cleared once, by the writer's grant.
	intentFence := queryOne[int64](t, p1, "SELECT fence FROM "+intentLog+" WHERE intent IS NOT NULL ORDER BY seq LIMIT 1")
	assert.Equal(t, intentFence+1, w.Token(), "a reader got in after the writer's intent was stored")
	assert.Equal(t, 2, queryOne[int](t, p1, "SELECT count(*) FROM "+intentLog))
}
