package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/lease"
)

// fencedLease is a lease form under test: acquire blocks (or retries) until it holds
// the resource and returns the token and a release.
type fencedLease func(ctx context.Context, who int) (token int64, release func() error, err error)

// Holders on two pools take a short-TTL lease in turn and write a protected row through
// lease.Fence; a quarter of them stall past the TTL before writing (a GC pause), so
// others take over by expiry and the late writes must be refused. The history of
// acquisitions (with tokens) and fenced writes is checked for linearizability against
// history.LeaseModel: tokens rise, and no write is accepted after a higher token's.
// One stale write is forced first: A holds, B takes over when A expires and writes, then
// A's write is rejected.
func TestFencedWritesWithExpiriesLinearizable(t *testing.T) {
	const ttl = 250 * time.Millisecond
	const workers, rounds = 6, 5
	run := func(t *testing.T, p1 *pgxpool.Pool, schema, resource string, acquire fencedLease) {
		ctx := testCtx(t)
		accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
		mustExec(t, p1, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0)")
		mustExec(t, p1, "INSERT INTO "+accounts+" (id) VALUES (1)")
		f, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: "accounts"})
		require.NoError(t, err)
		rec := history.NewRecorder("test", nil)
		var mu sync.Mutex
		counts := map[history.Outcome]int{}

		take := func(who int) (int64, func() error) {
			p := rec.Begin(history.Op{Client: fmt.Sprint("h", who), Key: resource, Kind: history.Acquire})
			token, release, err := acquire(ctx, who)
			if err != nil {
				p.End(history.Unknown, 0)
				require.NoError(t, err)
			}
			p.End(history.OK, token)
			return token, release
		}
		write := func(who int, token int64) history.Outcome {
			p := rec.Begin(history.Op{Client: fmt.Sprint("h", who), Key: resource, Kind: history.Write, Token: token})
			err := f.Update(ctx, p1, 1, token, map[string]any{"balance": who})
			out := history.OK
			switch {
			case errors.Is(err, lease.ErrLeaseLost):
				out = history.Rejected
			case err != nil:
				out = history.Unknown
			}
			p.End(out, 0)
			assert.True(t, err == nil || out == history.Rejected, "holder %d write: %v", who, err)
			mu.Lock()
			counts[out]++
			mu.Unlock()
			return out
		}

		// The forced stale write.
		ta, releaseA := take(-1)
		tb, releaseB := take(-2) // waits for A's lease to expire
		require.Greater(t, tb, ta)
		require.Equal(t, history.OK, write(-2, tb))
		require.Equal(t, history.Rejected, write(-1, ta), "a write with the expired holder's token")
		assert.Error(t, releaseA(), "A's lease was taken over")
		require.NoError(t, releaseB())

		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for range rounds {
					token, release := take(w)
					if rng.IntN(4) == 0 {
						time.Sleep(ttl + time.Duration(rng.Int64N(int64(ttl)))) // a pause past the TTL: the workload, not synchronisation
					}
					write(w, token)
					write(w, token)
					_ = release() // ErrLeaseLost after a pause
				}
			})
		}
		wg.Wait()
		v := history.Check(t, history.LeaseModel(), rec.Ops())
		t.Logf("writes: %v; %v", counts, v)
	}

	t.Run("manager", func(t *testing.T) {
		p1, p2, schema := twoPools(t)
		cfg := lease.ManagerConfig{TTL: ttl, PollInterval: 50 * time.Millisecond}
		ms := []*lease.Manager{newManager(t, p1, schema, cfg), newManager(t, p2, schema, cfg)}
		run(t, p1, schema, "acct", func(ctx context.Context, who int) (int64, func() error, error) {
			l, err := ms[(who+2)%2].Acquire(ctx, "acct", nil)
			if err != nil {
				return 0, nil, err
			}
			return l.Token(), func() error { return l.Release(context.Background()) }, nil
		})
	})

	t.Run("column", func(t *testing.T) {
		p1, p2, schema := twoPools(t)
		cols := []*lease.Column{usersTable(t, p1, schema, ttl, 1), nil}
		var err error
		cols[1], err = lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
			OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: ttl})
		require.NoError(t, err)
		run(t, p1, schema, "users/1", func(ctx context.Context, who int) (int64, func() error, error) {
			for {
				cl, err := cols[(who+2)%2].TryAcquire(ctx, int64(1))
				if err == nil {
					return cl.Token(), func() error { return cl.Release(context.Background()) }, nil
				}
				if !errors.Is(err, lease.ErrNotAcquired) {
					return 0, nil, err
				}
				time.Sleep(rand.N(5 * time.Millisecond)) // back-off between tries, not synchronisation
			}
		})
	})
}

// The lease checker can fail: a broken fence, a plain UPDATE without the token
// comparison, lets a holder whose lease was taken over write after its successor. Run
// against PostgreSQL with real leases, porcupine rejects the history.
func TestCheckerRejectsUnfencedWrite(t *testing.T) {
	p1, _, schema := twoPools(t)
	ctx := testCtx(t)
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	mustExec(t, p1, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, p1, "INSERT INTO "+accounts+" (id) VALUES (1)")
	m := newManager(t, p1, schema, lease.ManagerConfig{TTL: time.Minute})
	rec := history.NewRecorder("test", nil)

	take := func(client string) *lease.Lease {
		p := rec.Begin(history.Op{Client: client, Key: "acct", Kind: history.Acquire})
		l, err := m.TryAcquire(ctx, "acct", nil)
		require.NoError(t, err)
		p.End(history.OK, l.Token())
		return l
	}
	brokenWrite := func(client string, token int64) {
		p := rec.Begin(history.Op{Client: client, Key: "acct", Kind: history.Write, Token: token})
		tag, err := p1.Exec(ctx, "UPDATE "+accounts+" SET balance = balance + 1, fence_token = $1 WHERE id = 1", token)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		p.End(history.OK, 0)
	}
	// A holds and is "paused"; its lease is released for it (as an expiry would), B
	// takes over and writes; A wakes and writes with its old token.
	a := take("A")
	require.NoError(t, a.Release(ctx))
	b := take("B")
	brokenWrite("B", b.Token())
	brokenWrite("A", a.Token())
	require.NoError(t, b.Release(ctx))

	v := history.Run(history.LeaseModel(), rec.Ops(), history.CheckTimeout)
	t.Logf("unfenced write: %v", v)
	assert.Equal(t, porcupine.Illegal, v.Result)
}
