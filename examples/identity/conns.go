package main

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Demo instrumentation, not part of the pattern: which request holds which pooled
// connection, so that the fake partner can report, on every call it receives, how many
// database connections the calling request is holding at that moment.

type requestKey struct{}

// withRequest tags ctx (and every pool acquisition made with it) with a request id.
func withRequest(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestKey{}, id)
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestKey{}).(string)
	return id
}

// connTracker is a pgxpool acquire/release tracer mapping each acquired connection to the
// request whose context acquired it.
type connTracker struct {
	mu    sync.Mutex
	owner map[*pgx.Conn]string
}

func newConnTracker() *connTracker { return &connTracker{owner: map[*pgx.Conn]string{}} }

// held returns how many connections the request holds now.
func (t *connTracker) held(id string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, o := range t.owner {
		if o == id {
			n++
		}
	}
	return n
}

func (t *connTracker) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (t *connTracker) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err == nil {
		t.mu.Lock()
		t.owner[d.Conn] = requestID(ctx)
		t.mu.Unlock()
	}
}

func (t *connTracker) TraceRelease(_ *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	t.mu.Lock()
	delete(t.owner, d.Conn)
	t.mu.Unlock()
}

// pgx wants a query tracer in ConnConfig.Tracer; the pool finds the acquire and release
// methods on it by type assertion.
func (t *connTracker) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *connTracker) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
