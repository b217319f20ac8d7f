package lease_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

type renewRecorder struct {
	mu   sync.Mutex
	got  []lease.TraceRenewData
	seen chan struct{} // one token per renewal, if made
}

func (r *renewRecorder) TraceRenew(_ context.Context, d lease.TraceRenewData) {
	r.mu.Lock()
	r.got = append(r.got, d)
	r.mu.Unlock()
	if r.seen != nil {
		select {
		case r.seen <- struct{}{}:
		default:
		}
	}
}

func (r *renewRecorder) all() []lease.TraceRenewData {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lease.TraceRenewData(nil), r.got...)
}

func TestRenewTracedAndLogged(t *testing.T) {
	ctx := testCtx(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	rec := &renewRecorder{seen: make(chan struct{}, 100)}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	// A TTL far above the renewal interval: this test is about tracing, and
	// a loaded machine must not lose the lease (a 600 ms TTL did, once, at
	// load 35, when a renewal was slower than the TTL).
	m := newManager(t, pool, schema, lease.ManagerConfig{TTL: 10 * time.Second, Tracer: rec, Logger: logger})
	// Do renews in the background, every 100 ms here: wait for two renewals.
	err := m.Do(ctx, "reports", &lease.DoOptions{RenewEvery: 100 * time.Millisecond}, func(ctx context.Context, l *lease.Lease) error {
		deadline := time.After(20 * time.Second)
		for i := 0; i < 2; i++ {
			select {
			case <-deadline:
				return errors.New("no renewals seen")
			case <-rec.seen:
			}
		}
		return nil
	})
	require.NoError(t, err)
	got := rec.all()
	require.GreaterOrEqual(t, len(got), 2)
	assert.Equal(t, lease.FormManager, got[0].Form)
	assert.Equal(t, "reports", got[0].Resource)
	assert.NoError(t, got[0].Err)
	assert.Positive(t, got[0].Token)

	// A renewal of a lease that is gone is traced as lost and logged at Warn.
	l, err := m.TryAcquire(ctx, "gone", nil)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Renew(ctx), lease.ErrLeaseLost)
	last := rec.all()[len(rec.all())-1]
	assert.ErrorIs(t, last.Err, lease.ErrLeaseLost)
	assert.Contains(t, logs.String(), "level=WARN msg=\"lease renew\"")

	// The column form reports its own form.
	colRec := &renewRecorder{}
	mustExec(t, pool, "CREATE TABLE "+schema+".docs (id bigint PRIMARY KEY, locked_at timestamptz, locked_by text, lock_fence bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+schema+".docs (id) VALUES (1)")
	col, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: schema, Table: "docs", TTL: time.Minute, Tracer: colRec})
	require.NoError(t, err)
	cl, err := col.TryAcquire(ctx, int64(1))
	require.NoError(t, err)
	require.NoError(t, cl.Renew(ctx))
	require.NoError(t, cl.Release(ctx))
	require.Len(t, colRec.all(), 1)
	assert.Equal(t, lease.FormColumn, colRec.all()[0].Form)
	assert.Equal(t, "1", colRec.all()[0].Resource)
}
