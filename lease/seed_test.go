package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// The seed scenario: a user has two identities at an identity provider, one
// primary and one linked to it. "Switch primary identity" is two calls to the
// provider (unlink the secondary from the current primary, then link the old
// primary under the new one) plus a local update of users.auth_id. Two
// switches that interleave leave the provider in a state no single switch
// produces (a cycle, two primaries, or a primary the database disagrees with),
// and nothing local can detect it afterwards.

const (
	identityA = "google|u1"
	identityB = "github|u1"
)

// partner is a fake identity provider. Like many real APIs it accepts any
// well-formed call; consistency is the caller's job.
type partner struct {
	mu      sync.Mutex
	parent  map[string]string      // identity -> the primary it is linked to; "" for a primary
	latency func()                 // simulated network and processing time
	inCall  atomic.Pointer[func()] // runs inside every handler (the AcquiredConns check)
	calls   atomic.Int64
}

func newPartner() *partner {
	return &partner{parent: initialLinks()}
}

func initialLinks() map[string]string {
	return map[string]string{identityA: "", identityB: identityA}
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.calls.Add(1)
	if f := p.inCall.Load(); f != nil {
		(*f)()
	}
	if p.latency != nil {
		p.latency()
	}
	primary, secondary := r.FormValue("primary"), r.FormValue("secondary")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.URL.Path {
	case "/unlink":
		p.parent[secondary] = ""
	case "/link":
		p.parent[secondary] = primary
	default:
		http.NotFound(w, r)
	}
}

// primary returns the one identity that is a primary with the other linked to
// it, or an error describing the corruption.
func (p *partner) primary() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, b := p.parent[identityA], p.parent[identityB]
	switch {
	case a == "" && b == identityA:
		return identityA, nil
	case b == "" && a == identityB:
		return identityB, nil
	}
	return "", fmt.Errorf("corrupt: %s -> %q, %s -> %q", identityA, a, identityB, b)
}

// identityClient calls the partner. It holds no database connection.
type identityClient struct {
	base string
	http *http.Client
}

func (c identityClient) call(ctx context.Context, path, primary, secondary string) error {
	form := url.Values{"primary": {primary}, "secondary": {secondary}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path+"?"+form.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return nil
}

// identities is the local side: users(id, auth_id, auth_fence) plus the
// column lease on the identity_action_* columns.
type identities struct {
	pool   *pgxpool.Pool
	users  string // quoted
	col    *lease.Column
	fence  *lease.Fence
	client identityClient
}

func newIdentities(pool *pgxpool.Pool, schema string, col *lease.Column, client identityClient) (*identities, error) {
	f, err := lease.NewFence(lease.FenceConfig{Schema: schema, Table: "users", TokenColumn: "auth_fence"})
	if err != nil {
		return nil, err
	}
	return &identities{pool: pool, users: pgx.Identifier{schema, "users"}.Sanitize(), col: col, fence: f, client: client}, nil
}

// switchUnprotected is the bug: read, two HTTP calls, write, with nothing
// keeping another switch of the same user out.
func (s *identities) switchUnprotected(ctx context.Context, userID int64) error {
	var current string
	if err := s.pool.QueryRow(ctx, "SELECT auth_id FROM "+s.users+" WHERE id = $1", userID).Scan(&current); err != nil {
		return err
	}
	target := otherIdentity(current)
	if err := s.client.call(ctx, "/unlink", current, target); err != nil {
		return err
	}
	if err := s.client.call(ctx, "/link", target, current); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, "UPDATE "+s.users+" SET auth_id = $2 WHERE id = $1", userID, target)
	return err
}

// switchLeased is the fix: the same steps under a column lease, claimed by one
// committed UPDATE and released by another; no connection or transaction is
// held across the HTTP calls. The local write is fenced with the lease token,
// so a holder that overran its lease cannot overwrite a newer holder's result.
// It returns lease.ErrNotAcquired if another switch is in progress (an HTTP
// handler would answer 409 Conflict). inside, if not nil, runs first thing
// under the lease.
func (s *identities) switchLeased(ctx context.Context, userID int64, inside func()) error {
	return s.col.TryDo(ctx, userID, nil, func(ctx context.Context, l *lease.ColumnLease) error {
		if inside != nil {
			inside()
		}
		var current string // read under the lease: no stale decision
		if err := s.pool.QueryRow(ctx, "SELECT auth_id FROM "+s.users+" WHERE id = $1", userID).Scan(&current); err != nil {
			return err
		}
		target := otherIdentity(current)
		if err := s.client.call(ctx, "/unlink", current, target); err != nil {
			return err
		}
		if err := s.client.call(ctx, "/link", target, current); err != nil {
			return err
		}
		return s.fence.Update(ctx, s.pool, userID, l.Token(), map[string]any{"auth_id": target})
	})
}

func otherIdentity(id string) string {
	if id == identityA {
		return identityB
	}
	return identityA
}

// seedSetup creates users(1) with auth_id = identityA, the lease columns, and
// the fenced auth_fence column.
func seedSetup(t testing.TB, pool *pgxpool.Pool, schema string) *lease.Column {
	t.Helper()
	col := usersTable(t, pool, schema, 10*time.Second, 1)
	users := pgx.Identifier{schema, "users"}.Sanitize()
	mustExec(t, pool, "ALTER TABLE "+users+" ADD COLUMN auth_fence bigint NOT NULL DEFAULT 0")
	mustExec(t, pool, "UPDATE "+users+" SET auth_id = $1", identityA)
	return col
}

func TestSeedSwitchPrimaryIdentity(t *testing.T) {
	const switches = 50
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	col := seedSetup(t, p1, schema)
	col2, err := lease.NewColumn(p2, lease.ColumnConfig{Schema: schema, Table: "users", LockedAtColumn: "identity_action_locked_at",
		OwnerColumn: "identity_action_locked_by", FenceColumn: "identity_action_fence", TTL: 10 * time.Second})
	require.NoError(t, err)
	users := pgx.Identifier{schema, "users"}.Sanitize()

	api := newPartner()
	api.latency = func() { time.Sleep(time.Duration(500+rand.N(1500)) * time.Microsecond) }
	srv := httptest.NewServer(api)
	defer srv.Close()
	client := identityClient{base: srv.URL, http: srv.Client()}
	sides := make([]*identities, 2)
	for i, c := range []*lease.Column{col, col2} {
		sides[i], err = newIdentities([]*pgxpool.Pool{p1, p2}[i], schema, c, client)
		require.NoError(t, err)
	}
	reset := func() {
		api.mu.Lock()
		api.parent = initialLinks()
		api.mu.Unlock()
		mustExec(t, p1, "UPDATE "+users+" SET auth_id = $1", identityA)
	}
	check := func() error {
		primary, err := api.primary()
		if err != nil {
			return err
		}
		if local := queryOne[string](t, p1, "SELECT auth_id FROM "+users+" WHERE id = 1"); local != primary {
			return fmt.Errorf("corrupt: the provider's primary is %s, the database says %s", primary, local)
		}
		return nil
	}

	t.Run("without lease", func(t *testing.T) {
		// Each round: 50 switches arriving within 20ms of each other. The
		// race needs a switch to read the local state while another is
		// between its calls, so a round can end consistent by luck; a few
		// rounds make corruption certain in practice.
		var corrupted error
		for round := 0; round < 10 && corrupted == nil; round++ {
			reset()
			var wg sync.WaitGroup
			for i := range switches {
				wg.Go(func() {
					time.Sleep(rand.N(20 * time.Millisecond)) // arrival time
					assert.NoError(t, sides[i%2].switchUnprotected(ctx, 1))
				})
			}
			wg.Wait()
			corrupted = check()
			t.Logf("round %d: %v", round, corrupted)
		}
		require.Error(t, corrupted, "50 concurrent unprotected switches never corrupted the provider")
	})

	t.Run("with lease", func(t *testing.T) {
		reset()
		// Inside every partner call, no database connection may be held by
		// either pool. Rounds make that checkable while switches contend:
		// all pending switches try at once; the one that wins waits until
		// every other try of its round has returned before it calls the
		// partner; the losers try again in the next round.
		var violations atomic.Int64
		noConns := func() {
			if n := p1.Stat().AcquiredConns() + p2.Stat().AcquiredConns(); n != 0 {
				violations.Add(1)
			}
		}
		api.inCall.Store(&noConns)
		defer api.inCall.Store(nil)
		callsBefore := api.calls.Load()
		for round, pending := 0, switches; pending > 0; round, pending = round+1, pending-1 {
			var tried, wg sync.WaitGroup
			tried.Add(pending)
			var winners atomic.Int64
			for i := range pending {
				wg.Go(func() {
					won := false
					err := sides[i%2].switchLeased(ctx, 1, func() {
						won = true
						winners.Add(1)
						tried.Done()
						tried.Wait()
					})
					if !won {
						tried.Done()
					}
					if !errors.Is(err, lease.ErrNotAcquired) {
						assert.NoError(t, err)
					}
				})
			}
			wg.Wait()
			require.Equal(t, int64(1), winners.Load(), "round %d: exactly one switch holds the lease", round)
			require.NoError(t, check(), "round %d", round)
		}
		assert.Zero(t, violations.Load(), "a database connection was held during a partner call")
		assert.Equal(t, int64(2*switches), api.calls.Load()-callsBefore)
		primary, _ := api.primary()
		assert.Equal(t, identityA, primary, "an even number of switches ends where it started")
		// 50 acquisitions, each the only one of its round; the last local
		// write carried the last token.
		assert.Equal(t, int64(switches), queryOne[int64](t, p1, "SELECT identity_action_fence FROM "+users+" WHERE id = 1"))
		assert.Equal(t, int64(switches), queryOne[int64](t, p1, "SELECT auth_fence FROM "+users+" WHERE id = 1"))
	})

	// The check above is not vacuous: the @Transactional version, a row lock
	// held in a transaction across the partner calls, trips it.
	t.Run("transaction across the calls is detected", func(t *testing.T) {
		reset()
		var violations atomic.Int64
		noConns := func() {
			if p1.Stat().AcquiredConns() != 0 {
				violations.Add(1)
			}
		}
		api.inCall.Store(&noConns)
		defer api.inCall.Store(nil)
		err := pgx.BeginFunc(ctx, p1, func(tx pgx.Tx) error {
			var current string
			if err := tx.QueryRow(ctx, "SELECT auth_id FROM "+users+" WHERE id = 1 FOR UPDATE").Scan(&current); err != nil {
				return err
			}
			if err := client.call(ctx, "/unlink", current, otherIdentity(current)); err != nil {
				return err
			}
			if err := client.call(ctx, "/link", otherIdentity(current), current); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE "+users+" SET auth_id = $1 WHERE id = 1", otherIdentity(current))
			return err
		})
		require.NoError(t, err)
		assert.Equal(t, int64(2), violations.Load())
	})
}
