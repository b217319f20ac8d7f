package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/examples/internal/extest"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Concurrent transfers within and across tenants: the total is conserved, no balance goes
// negative, one transfer at a time per tenant, and no deadlock.
func TestTransfersStayConsistent(t *testing.T) {
	res, out := runTenant(t, config{Tenants: 4, Accounts: 5, Workers: 16, Transfers: 800, Cross: 0.3})
	assert.Equal(t, res.Before, res.After, "total balance")
	assert.Zero(t, res.Negative, "negative balances")
	assert.Zero(t, res.Deadlocks, "40P01")
	assert.EqualValues(t, 1, res.MaxPerTenant, "transfers inside one tenant at once")
	assert.EqualValues(t, 800, res.Done+res.Declined)
	assert.Positive(t, res.Cross)
	assert.Contains(t, out, "total balance before 20000, after 20000: consistent")
}

// Only cross-tenant transfers between two tenants, in both directions at once: the worst
// case for lock-order deadlocks. WithXactLockAll sorts the keys, so there are none.
func TestOppositeCrossTransfersNeverDeadlock(t *testing.T) {
	res, _ := runTenant(t, config{Tenants: 2, Accounts: 2, Workers: 16, Transfers: 600, Cross: 1})
	assert.Zero(t, res.Deadlocks, "40P01")
	assert.EqualValues(t, 600, res.Done+res.Declined)
	assert.Equal(t, res.Cross, res.Done, "every committed transfer crossed tenants")
	assert.Equal(t, res.Before, res.After)
	assert.EqualValues(t, 1, res.MaxPerTenant)
}

func runTenant(t *testing.T, cfg config) (result, string) {
	t.Helper()
	cfg.URL = extest.DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard, not a budget
	defer cancel()
	var out strings.Builder
	res, err := run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	return res, out.String()
}
