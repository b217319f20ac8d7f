package pooltx_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/pooltx"
)

// heldDialer dials like net.Dialer until hold is called; from then on every
// dial (pgx dials one for each cancel request) waits until release, as a
// cancel request does against a loaded server over TLS (a connect, a
// handshake and a fork). The wrapped DialFunc is pgconn.Config.DialFunc.
type heldDialer struct {
	held    atomic.Bool
	gate    chan struct{}
	once    sync.Once
	waiting atomic.Int32
}

func newHeldDialer(t *testing.T) *heldDialer {
	d := &heldDialer{gate: make(chan struct{})}
	t.Cleanup(d.release)
	return d
}

func (d *heldDialer) hold()    { d.held.Store(true) }
func (d *heldDialer) release() { d.once.Do(func() { close(d.gate) }) }

func (d *heldDialer) DialFunc(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.held.Load() {
		d.waiting.Add(1)
		<-d.gate // deliberately deaf to ctx: the slow part is the server's
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// A destroyed connection lets go at once: when pgx has already given up on
// the connection (the context ended mid-statement), its own close first
// sends a cancel request on a new connection and only then closes the
// socket, so the backend, idle in its transaction after the statement,
// kept every lock until that cancel request was through (seconds under
// load over TLS, up to pgx's 15 s). Release closes the socket itself: the
// locks go while the cancel request is still on its way.
func TestDestroyedConnectionLetsGoWhileCancelRequestHangs(t *testing.T) {
	ctx := testCtx(t)
	d := newHeldDialer(t)
	defer d.release() // before the harness's own cleanups dial again
	cfg := pgtest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = d.DialFunc
	pool := pgtest.NewPool(t, cfg)
	other := pgtest.Pool(t)
	k1, k2 := pgtest.UniqueInt64(t), pgtest.UniqueInt64(t)

	holder, err := other.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", k2)
	require.NoError(t, err)
	unlocked := false
	defer func() {
		if !unlocked {
			_, _ = holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_all()")
		}
	}()

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- pooltx.WithTx(cctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", k1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", k2) // waits for the holder
			return err
		})
	}()
	require.NoError(t, pollWaiter(ctx, other, k2))
	d.hold()
	cancel() // pgx's context handler gives up on the statement and closes the connection its way
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("WithTx did not return after its context was cancelled")
	}
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualValues(t, 0, pool.Stat().TotalConns(), "the connection is destroyed")

	// The backend still waits for k2: give it, so that it goes on and finds
	// its client gone. Its locks must go without the cancel request.
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", k2)
	require.NoError(t, err)
	unlocked = true
	start := time.Now()
	ok := assert.Eventually(t, func() bool { return keyFree(ctx, t, other, k1) && keyFree(ctx, t, other, k2) },
		10*time.Second, 2*time.Millisecond, "the destroyed connection's backend kept its locks while its cancel request hung")
	if ok {
		t.Logf("locks free %v after the holder let the backend go", time.Since(start).Round(time.Millisecond))
		assert.Positive(t, d.waiting.Load(), "the scenario must have a cancel request in flight")
	}
}
