// Command editor shows the pessimistic offline lock: a lock-manager table (lease.Manager)
// that lets one user at a time edit a document, across as many requests as the editing
// takes, while readers who need the document not to change share it.
//
// A database transaction cannot span a user's editing session (minutes, many HTTP
// requests, maybe a closed laptop), and an advisory lock would pin a connection for all
// of it. A lease is a row in a table: taken when the editor opens, renewed by the
// editor's heartbeat, released when it closes, and expired by the database's clock if the
// browser vanishes. Each acquisition gets a fencing token that the save checks, so an
// editor that lost its lease cannot overwrite its successor's work.
//
// Run it with:
//
//	go run ./examples/editor
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/lease"
)

const docID int64 = 42

type config struct {
	URL string
	TTL time.Duration // how long a lease lives without a heartbeat
}

func main() {
	cfg := config{URL: os.Getenv(exampledb.EnvURL)}
	flag.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL (short for the demo; minutes in a real editor)")
	flag.Parse()
	exampledb.Main("editor", func(ctx context.Context) error {
		_, err := run(ctx, cfg, os.Stdout)
		return err
	})
}

// editors is the application side: documents, and a lock manager whose resources are
// "document:<id>".
type editors struct {
	pool  *pgxpool.Pool
	locks *lease.Manager
	fence *lease.Fence
}

func resource(doc int64) string { return fmt.Sprintf("document:%d", doc) }

// open takes the document's lease for user: Exclusive to edit, Shared to read. With wait
// it blocks until the lease can be had (woken by LISTEN/NOTIFY when a holder releases, or
// when the blocking lease expires) or ctx ends; without, a busy document is ErrNotAcquired.
func (e *editors) open(ctx context.Context, doc int64, user string, mode lease.Mode, wait bool) (*lease.Lease, error) {
	meta, _ := json.Marshal(map[string]string{"user": user, "doc": fmt.Sprint(doc)})
	opts := &lease.AcquireOptions{Mode: mode, Owner: user, Metadata: meta}
	if wait {
		return e.locks.Acquire(ctx, resource(doc), opts)
	}
	return e.locks.TryAcquire(ctx, resource(doc), opts)
}

// holders describes who has the document, for a "locked by ..." message.
func (e *editors) holders(ctx context.Context, doc int64) (string, error) {
	hs, err := e.locks.List(ctx, &lease.ListOptions{Resource: resource(doc)})
	if err != nil {
		return "", err
	}
	var who []string
	for _, h := range hs {
		verb := "reading"
		if h.Mode == lease.Exclusive {
			verb = "editing"
		}
		who = append(who, fmt.Sprintf("%s is %s it (since %s, lease until %s)", h.Owner, verb,
			h.AcquiredAt.Format("15:04:05.000"), h.ExpiresAt.Format("15:04:05.000")))
	}
	if len(who) == 0 {
		return "nobody has it", nil
	}
	return strings.Join(who, "; "), nil
}

// save writes a new body under the editor's lease. The UPDATE checks the fencing token
// (documents.fence_token <= token): once a later editor has saved, an earlier one whose
// lease was lost is refused with lease.ErrLeaseLost, whatever it believes.
func (e *editors) save(ctx context.Context, l *lease.Lease, doc int64, body string) error {
	return e.fence.Update(ctx, e.pool, doc, l.Token(), map[string]any{"body": body, "saved_by": l.Owner()})
}

// story is what the run observed, for the test.
type story struct {
	Tokens             map[string]int64 // "alice-1" (first acquisition), "carol", ...
	BobRefused         error            // bob asked to edit while alice edited
	CarolRefused       error            // carol asked to read while alice edited
	ReadersTogether    bool             // carol and dave held read leases at once
	BobWaited          time.Duration    // bob's blocking wait behind the readers
	BobWokeAfter       time.Duration    // from the readers' release to bob's lease
	AliceWaited        time.Duration    // alice's blocking wait for bob's abandoned lease
	BobExpiresAt       time.Time        // bob's lease expiry, on the database's clock
	AliceTookOverAt    time.Time        // alice's second acquisition, on the database's clock
	StaleSave          error            // bob's save after his lease was taken over
	StaleRenew         error
	FinalBody, SavedBy string
}

func run(ctx context.Context, cfg config, out io.Writer) (st story, err error) {
	st.Tokens = map[string]int64{}
	db, err := exampledb.Open(ctx, cfg.URL, os.Stderr)
	if err != nil {
		return st, err
	}
	defer db.Close()
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-editor", MaxConns: 4, Schema: "pgxlock_example_editor"})
	if err != nil {
		return st, err
	}
	defer pool.Close()
	e, err := setup(ctx, pool, cfg.TTL)
	if err != nil {
		return st, err
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	busy := func(user, what string, err error) error {
		if !errors.Is(err, lease.ErrNotAcquired) {
			return fmt.Errorf("%s: expected the document to be busy, got %v", user, err)
		}
		who, herr := e.holders(ctx, docID)
		say("%s asks to %s: refused, %s", user, what, who)
		return herr
	}
	wait := func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, 10*cfg.TTL) // never wait forever in a demo
	}
	say("document %d, lock-manager table pgxlock_leases, lease TTL %v", docID, cfg.TTL)

	// 1. One editor; everybody else is refused, readers included.
	alice, err := e.open(ctx, docID, "alice", lease.Exclusive, false)
	if err != nil {
		return st, err
	}
	st.Tokens["alice-1"] = alice.Token()
	say("alice opens the editor: granted, exclusive, fencing token %d", alice.Token())
	_, st.BobRefused = e.open(ctx, docID, "bob", lease.Exclusive, false)
	if err := busy("bob", "edit", st.BobRefused); err != nil {
		return st, err
	}
	_, st.CarolRefused = e.open(ctx, docID, "carol", lease.Shared, false)
	if err := busy("carol", "read", st.CarolRefused); err != nil {
		return st, err
	}
	// The editor's heartbeat (a browser pings every TTL/3, say) keeps the lease alive.
	if err := alice.Renew(ctx); err != nil {
		return st, err
	}
	say("alice's editor sends a heartbeat: lease renewed until %s", alice.ExpiresAt().Format("15:04:05.000"))
	if err := e.save(ctx, alice, docID, "v2 by alice"); err != nil {
		return st, err
	}
	say("alice saves with token %d: saved", alice.Token())
	if err := alice.Release(ctx); err != nil {
		return st, err
	}
	say("alice closes the editor: released")

	// 2. Readers share the document; an editor waits for them to leave.
	carol, err := e.open(ctx, docID, "carol", lease.Shared, false)
	if err != nil {
		return st, err
	}
	dave, err := e.open(ctx, docID, "dave", lease.Shared, false)
	if err != nil {
		return st, err
	}
	st.Tokens["carol"], st.Tokens["dave"] = carol.Token(), dave.Token()
	st.ReadersTogether = true
	say("carol and dave open it to read: both granted, shared, tokens %d and %d", carol.Token(), dave.Token())

	type acquired struct {
		l      *lease.Lease
		waited time.Duration
		err    error
	}
	bobCh := make(chan acquired, 1)
	say("bob asks to edit and waits for the readers to leave")
	go func() {
		ctx, cancel := wait(ctx)
		defer cancel()
		t0 := time.Now()
		l, err := e.open(ctx, docID, "bob", lease.Exclusive, true)
		bobCh <- acquired{l, time.Since(t0), err}
	}()
	time.Sleep(cfg.TTL / 4) // the readers read for a moment (the story's pace, not synchronisation)
	if err := errors.Join(carol.Release(ctx), dave.Release(ctx)); err != nil {
		return st, err
	}
	released := time.Now()
	say("carol and dave close the document")
	got := <-bobCh
	if got.err != nil {
		return st, got.err
	}
	bob := got.l
	st.Tokens["bob"], st.BobWaited, st.BobWokeAfter = bob.Token(), got.waited, time.Since(released)
	say("bob gets the editor after waiting %v (woken by the release's NOTIFY): token %d",
		got.waited.Round(time.Millisecond), bob.Token())

	// 3. An editor that vanishes: no heartbeat, no release. The lease expires on the
	// database's clock and the next editor takes over with a larger token.
	say("bob's laptop goes to sleep: no more heartbeats")
	say("alice asks to edit and waits")
	wctx, cancel := wait(ctx)
	t0 := time.Now()
	alice, err = e.open(wctx, docID, "alice", lease.Exclusive, true)
	cancel()
	if err != nil {
		return st, err
	}
	st.Tokens["alice-2"], st.AliceWaited = alice.Token(), time.Since(t0)
	st.BobExpiresAt, st.AliceTookOverAt = bob.ExpiresAt(), alice.AcquiredAt()
	say("alice gets the editor after %v, when bob's lease expired: token %d",
		st.AliceWaited.Round(time.Millisecond), alice.Token())
	if err := e.save(ctx, alice, docID, "v3 by alice"); err != nil {
		return st, err
	}
	say("alice saves with token %d: saved", alice.Token())

	st.StaleSave = e.save(ctx, bob, docID, "v3 by bob (stale)")
	say("bob's laptop wakes up and autosaves with token %d: %v", bob.Token(), st.StaleSave)
	st.StaleRenew = bob.Renew(ctx)
	say("bob's heartbeat: %v: his editor must reload", st.StaleRenew)
	if err := alice.Release(ctx); err != nil {
		return st, err
	}
	say("alice closes the editor: released")

	if err := pool.QueryRow(ctx, `SELECT body, saved_by FROM documents WHERE id = $1`, docID).Scan(&st.FinalBody, &st.SavedBy); err != nil {
		return st, err
	}
	who, err := e.holders(ctx, docID)
	if err != nil {
		return st, err
	}
	say("document %d now reads %q (saved by %s); %s", docID, st.FinalBody, st.SavedBy, who)
	return st, nil
}

// setup creates the documents table (from scratch on every run) and the lock-manager
// tables.
func setup(ctx context.Context, pool *pgxpool.Pool, ttl time.Duration) (*editors, error) {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS documents`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE documents (
		id          bigint PRIMARY KEY,
		body        text   NOT NULL,
		saved_by    text,
		fence_token bigint NOT NULL DEFAULT 0)`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO documents (id, body) VALUES ($1, 'v1')`, docID); err != nil {
		return nil, err
	}
	// The demo starts from empty lock-manager tables (the holders and the per-resource
	// fencing counters), so that its tokens start at 1. Never do this in a real service:
	// the counters are what keeps tokens increasing.
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS pgxlock_leases, pgxlock_leases_resources`); err != nil {
		return nil, err
	}
	locks, err := lease.NewManager(pool, lease.ManagerConfig{TTL: ttl})
	if err != nil {
		return nil, err
	}
	// Idempotent, and safe when several instances start at once; a real service would
	// run it with its migrations.
	if err := locks.Migrate(ctx); err != nil {
		return nil, err
	}
	fence, err := lease.NewFence(lease.FenceConfig{Table: "documents"})
	if err != nil {
		return nil, err
	}
	return &editors{pool: pool, locks: locks, fence: fence}, nil
}
