package pgxlockotel_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockotel "github.com/pgxlock/pgxlock/contrib/otel"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// Install the tracer in the advisory.Config: every acquisition is a span,
// ended (and exported) at its outcome, and every lock acquired is a hold
// span, ended at the release or the loss.
func ExampleNew() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder() // in production: an exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	tracer, err := pgxlockotel.New(pgxlockotel.Config{TracerProvider: tp})
	if err != nil {
		panic(err)
	}
	locker, _ := advisory.New(pool, advisory.Config{Tracer: tracer})
	_ = locker.WithLock(ctx, keys.Hash("pgxlock-example-otel"), nil, func(context.Context, *pgx.Conn) error { return nil })

	for _, s := range spans.Ended() {
		fmt.Print(s.Name())
		for _, e := range s.Events() {
			fmt.Print(" ", e.Name)
		}
		fmt.Println()
	}
	// Output:
	// pgxlock.acquire
	// pgxlock.hold pgxlock.released
}
