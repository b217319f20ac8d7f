package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// harness is the per-test-binary state: the database discovered once, and whether Main
// is in charge of stopping it.
var harness struct {
	mainRunning atomic.Bool
	once        sync.Once
	db          database
	err         error

	atExitMu sync.Mutex
	atExit   []func()
}

// AtExit registers f to run once the tests of the binary have finished, before [Main]
// stops the database: for what outlives a single test, such as a program built once and
// shared by the package's tests, which a test's own Cleanup would remove too early.
// Functions run in reverse order of registration.
func AtExit(f func()) {
	harness.atExitMu.Lock()
	defer harness.atExitMu.Unlock()
	harness.atExit = append(harness.atExit, f)
}

func runAtExit() {
	harness.atExitMu.Lock()
	fs := harness.atExit
	harness.atExit = nil
	harness.atExitMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Main runs the tests of a package and owns what the harness started. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// After m.Run it runs the functions registered with [AtExit], then stops the throwaway cluster or container, if discovery started one; then,
// when the tests passed, it waits (at most 20 s) for the goroutines pgx starts to close
// interrupted connections in the background ((*PgConn).asyncClose, which may drain a TLS
// socket for up to 15 s), then checks for leaked goroutines (goleak, allowing
// testcontainers' reaper connection and idle HTTP connections of the Docker client) and
// prints them and exits 1 if any remain. It never returns: it calls os.Exit with the tests' code (1 when
// the tests passed but stopping the database failed or goroutines leaked).
func Main(m *testing.M) {
	harness.mainRunning.Store(true)
	ignore := goleak.IgnoreCurrent()
	code := m.Run()
	runAtExit()

	// Nothing may start a database after this point.
	harness.once.Do(func() { harness.err = fmt.Errorf("pgtest: DSN called after the tests finished") })
	if db := harness.db; db.Stop != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := db.Stop(ctx)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stopping %s: %v\n", db.Via, err)
			if code == 0 {
				code = 1
			}
		}
	}
	if code == 0 {
		// pgx closes a connection whose query was interrupted in a goroutine of its own
		// that may drain the socket for up to 15 s (see pgxAsyncCloseCreator): wait for
		// those, and only those, to end before looking for leaks.
		awaitAsyncCloses(asyncCloseBound)
		if err := goleak.Find(ignore,
			// testcontainers keeps its reaper (Ryuk) connection open until the process
			// exits, by design: Ryuk removes the containers when it closes.
			goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
			// Idle keep-alive connections of the Docker client.
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			// golang-migrate (contrib/migrate) prefetches the next migrations' bodies
			// into pipes; when Up stops on an error nobody reads them, and the writers
			// stay blocked until the process exits: golang-migrate's, not ours.
			goleak.IgnoreAnyFunction("github.com/golang-migrate/migrate/v4.(*Migration).Buffer"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked by the tests:\n%v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// DSN returns the test database's connection string, discovering it on first use (see the
// package documentation for the order). It fails the test when no database can be found,
// with instructions, and when the test binary does not run [Main].
func DSN(t testing.TB) string {
	t.Helper()
	if !harness.mainRunning.Load() {
		t.Fatal("pgtest: call pgtest.Main from TestMain (func TestMain(m *testing.M) { pgtest.Main(m) }); " +
			"it stops the database the harness may start and checks for goroutine leaks")
	}
	harness.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		harness.db, harness.err = discover(ctx, realSources(os.LookupEnv))
		if harness.err == nil && testing.Verbose() {
			fmt.Fprintf(os.Stderr, "pgtest: test database from %s: %s\n", harness.db.Via, redact(harness.db.DSN))
		}
	})
	if harness.err != nil {
		t.Fatal(harness.err)
	}
	return harness.db.DSN
}
