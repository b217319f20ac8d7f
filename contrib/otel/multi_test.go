package pgxlockotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// Two Tracers of this package in one MultiTracer (two backends, or an old
// and a new provider) each export their own acquire and hold spans, every
// span ended: each finds its own state in the context (review 27: with one
// context key for all, the first exported nothing and its spans were never
// ended).
func TestTwoTracersInAMultiTracerEachExportTheirSpans(t *testing.T) {
	ctx := testCtx(t)
	ta, sra, _ := newTracer(t)
	tb, srb, _ := newTracer(t)
	l, err := advisory.New(pgtest.Pool(t), advisory.Config{Tracer: advisory.MultiTracer{ta, tb}})
	require.NoError(t, err)
	require.NoError(t, l.WithLock(ctx, testNS.Key(7), nil, func(context.Context, *pgx.Conn) error { return nil }))
	for name, sr := range map[string]*tracetest.SpanRecorder{"A": sra, "B": srb} {
		var names []string
		for _, s := range sr.Ended() {
			names = append(names, s.Name())
		}
		assert.ElementsMatch(t, []string{pgxlockotel.SpanAcquire, pgxlockotel.SpanHold}, names, "tracer %s", name)
		assert.Len(t, sr.Started(), 2, "tracer %s: every started span ended", name)
	}
}
