package lease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pgxlock/pgxlock/lease"
)

// Issue 11 item 6: with 4 writers and 4 readers hammering one resource,
// readers got 0/0/0/2 grants in 8s. Neither side may starve: every
// goroutine of both sides gets in. The test reports min/max grants per
// goroutine on both sides.
func TestReadersAndWritersBothProgress(t *testing.T) {
	const writers, readers = 4, 4
	const hold, pause, run = 10 * time.Millisecond, 5 * time.Millisecond, 4 * time.Second
	p1, p2, schema := twoPools(t)
	ctx := testCtx(t)
	cfg := lease.ManagerConfig{TTL: time.Minute, PollInterval: 200 * time.Millisecond}
	ms := []*lease.Manager{newManager(t, p1, schema, cfg), newManager(t, p2, schema, cfg)}

	rctx, cancel := context.WithTimeout(ctx, run)
	defer cancel()
	grants := make([]int, writers+readers)
	errs := make([]error, writers+readers)
	var wg sync.WaitGroup
	for who := range writers + readers {
		mode := lease.Exclusive
		if who >= writers {
			mode = lease.Shared
		}
		m := ms[who%2]
		wg.Go(func() {
			for rctx.Err() == nil {
				l, err := m.Acquire(rctx, "doc", &lease.AcquireOptions{Mode: mode})
				if err != nil {
					if !errors.Is(err, lease.ErrNotAcquired) || rctx.Err() == nil {
						errs[who] = err
					}
					return
				}
				grants[who]++
				time.Sleep(hold) // the work; not synchronisation
				if err := l.Release(context.WithoutCancel(ctx)); err != nil {
					errs[who] = err
					return
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	w, r := grants[:writers], grants[writers:]
	t.Logf("grants in %v: writers %v (min %d, max %d), readers %v (min %d, max %d)",
		run, w, slices.Min(w), slices.Max(w), r, slices.Min(r), slices.Max(r))
	assert.Positive(t, slices.Min(w), "a writer starved")
	assert.Positive(t, slices.Min(r), "a reader starved")
}
