package lease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 6 (seed 003): an acquisition-order policy for several
// resources. Callers asking for the same resources in opposite orders never
// wait for each other forever, and a try takes all or nothing.
func TestAcquireAllOppositeOrders(t *testing.T) {
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	cfg := lease.ManagerConfig{TTL: time.Minute, PollInterval: 200 * time.Millisecond}
	ms := []*lease.Manager{newManager(t, p1, schema, cfg), newManager(t, p2, schema, cfg)}
	orders := [][]string{{"a", "b", "c"}, {"c", "b", "a", "b"}}

	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for who := range 4 {
		wg.Go(func() {
			for range 5 {
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // far beyond any fair wait
				ls, err := ms[who%2].AcquireAll(wctx, orders[who%2], nil)
				cancel()
				if err != nil {
					errs[who] = err
					return
				}
				if len(ls) != 3 || inside.Add(1) != 1 {
					errs[who] = fmt.Errorf("%d leases, %d holders of the set at once", len(ls), inside.Load())
				}
				inside.Add(-1)
				for _, l := range ls {
					if err := l.Release(ctx); err != nil {
						errs[who] = err
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	// All or nothing.
	held, err := ms[1].TryAcquire(ctx, "b", nil)
	require.NoError(t, err)
	_, err = ms[0].TryAcquireAll(ctx, []string{"c", "a", "b"}, nil)
	require.ErrorIs(t, err, lease.ErrNotAcquired)
	hs, err := ms[0].List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, hs, 1, "a was given back")
	assert.Equal(t, "b", hs[0].Resource)
	require.NoError(t, held.Release(ctx))

	_, err = ms[0].AcquireAll(ctx, nil, nil)
	assert.ErrorIs(t, err, lease.ErrInvalid)
	_, err = ms[0].AcquireAll(ctx, []string{"a", ""}, nil)
	assert.ErrorIs(t, err, lease.ErrInvalid)
	ls, err := ms[0].AcquireAll(ctx, strings.Split(strings.Repeat("x,", lease.MaxResourcesPerCall)+"y", ","), nil)
	require.NoError(t, err, "duplicates count once")
	require.Len(t, ls, 2)
	for _, l := range ls {
		require.NoError(t, l.Release(ctx))
	}
}
