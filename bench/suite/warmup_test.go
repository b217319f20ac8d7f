package suite

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestWarmUpHoldsEveryWorkersKeyAtOnce: the processes workload's warm-up
// has all workers inside their critical sections at the same moment, so a
// pool dials one connection per worker before the measured window (taken
// one after another, one connection sufficed and the rest were dialled
// inside the window); a failing op is reported and does not hang the rest.
func TestWarmUpHoldsEveryWorkersKeyAtOnce(t *testing.T) {
	const n = 4
	var (
		mu        sync.Mutex
		in, most  int
		keysTaken []int64
	)
	op := func(_ context.Context, ks []int64, fn func()) error {
		mu.Lock()
		in++
		most = max(most, in)
		keysTaken = append(keysTaken, ks[0])
		mu.Unlock()
		call(fn)
		mu.Lock()
		in--
		mu.Unlock()
		return nil
	}
	workers := make([]Op, n)
	for i := range workers {
		workers[i] = op
	}
	if err := warmUp(context.Background(), workers, func(g int) int64 { return int64(100 + g) }); err != nil {
		t.Fatal(err)
	}
	if most != n {
		t.Errorf("at most %d of %d workers held their key at once", most, n)
	}
	if len(keysTaken) != n {
		t.Errorf("%d keys taken, want %d", len(keysTaken), n)
	}

	boom := errors.New("boom")
	workers[2] = func(context.Context, []int64, func()) error { return boom }
	if err := warmUp(context.Background(), workers, func(g int) int64 { return int64(g) }); !errors.Is(err, boom) {
		t.Errorf("warm-up with a failing op returned %v", err)
	}
}
