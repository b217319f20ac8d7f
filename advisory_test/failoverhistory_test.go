package advisory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/keys"
)

// Workers on one pool (multi-host DSN: primary, then standby) take session locks on two
// keys in a loop (blocking and try) while the primary is stopped and the standby
// promoted mid-run. Calls fail while no primary answers and succeed again on the
// promoted standby. The whole history is checked with history.LockModel: a holder whose
// section failed lost its lock at an unknown moment, and no two holders ever overlapped,
// before, across or after the failover. (The primary stops before the promotion: with
// both up, a cut-off old primary's holders and the new primary's are two lock spaces,
// which is what fencing tokens are for.)
func TestFailoverHistoryLinearizable(t *testing.T) {
	const workers, before, after = 6, 30, 30
	ctx := testCtx(t)
	f := newFailover(t, pglaunch.StandbyOptions{})
	l := failoverLocker(t, f.pool)
	ks := []keys.Key{int64Key(t), pairKey(t)}
	rec := history.NewRecorder("test", nil)

	var ok atomic.Int64 // sections completed
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := ks[rng.IntN(len(ks))]
				try := rng.IntN(3) == 0
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				a := beginAttempt(rec, fmt.Sprintf("w%d/%d", w, i), []keys.Key{k}, false)
				fn := func(ctx context.Context, conn *pgx.Conn) error {
					a.acquired()
					defer a.releasing()
					_, err := conn.Exec(ctx, "SELECT pg_sleep(0.001)")
					return err
				}
				var err error
				if try {
					err = l.TryWithLock(cctx, k, nil, fn)
				} else {
					err = l.WithLock(cctx, k, nil, fn)
				}
				cancel()
				if err != nil && a.got {
					a.lost(0) // the section failed: its session may have ended at any moment
				}
				a.released(err == nil)
				a.failed(attemptOutcome(err))
				switch {
				case err == nil:
					ok.Add(1)
				case !a.got && attemptOutcome(err) == history.Busy:
				default:
					failed.Add(1)
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // back-off while no primary answers
				}
			}
		})
	}
	defer func() { // stop the workers if the test fails early
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	require.Eventually(t, func() bool { return ok.Load() >= before }, waitBound, 5*time.Millisecond, "sections before the failover")
	require.NoError(t, f.primary.Stop(ctx))
	atStop := ok.Load()
	require.NoError(t, f.standby.Promote(ctx))
	require.Eventually(t, func() bool { return ok.Load() >= atStop+after }, waitBound, 5*time.Millisecond,
		"sections on the promoted standby")
	close(stop)
	wg.Wait()

	v := history.Check(t, history.LockModel(), rec.Ops())
	t.Logf("%d sections completed (%d before the stop), %d calls failed; %v", ok.Load(), atStop, failed.Load(), v)
	assert.Positive(t, failed.Load(), "no call met the failover")
	awaitLocks(t, ctx, f.onStandby, "the keys to be free", func(ls []advisory.LockInfo) bool { return len(ls) == 0 }, ks...)
}
