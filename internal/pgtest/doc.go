// Package pgtest gives tests a real PostgreSQL: a pool per test, keys and schemas unique to
// the test, and a check that the test left no advisory lock behind. Only _test.go files
// import it.
//
// # Wiring
//
// Every test binary that uses it calls [Main] from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Main runs the tests, then stops whatever server the harness started, then fails the
// binary if goroutines leaked. [DSN] (and everything built on it) fails a test that runs
// without Main, so that no throwaway server outlives its test binary.
//
// # Where the database comes from
//
// Found once per test binary, on first use, in this order:
//
//  1. the DSN in the environment variable PGXLOCK_TEST_DATABASE, when set and non-empty;
//  2. else a throwaway cluster started from local PostgreSQL server binaries (see package
//     internal/pglaunch), stopped and removed by Main;
//  3. else a postgres:15-alpine container through testcontainers-go, when a Docker engine
//     answers, terminated by Main;
//  4. else every test that asks for a database fails (never skips) with a message naming
//     these three ways.
//
// Binaries that are found but fail to start a cluster are a failure too, not a reason to
// try Docker: a broken local set-up should be fixed, not silently bypassed. Whatever the
// source, the DSN must answer a ping before a test gets it.
//
// # Private clusters
//
// Tests that restart, stop or break the server get their own throwaway cluster from
// [Cluster], and failover tests a primary with a streaming standby from [Replicated]
// (connect through pglaunch.MultiHostDSN). Both need local PostgreSQL server binaries
// whatever PGXLOCK_TEST_DATABASE says, fail the test without them, and are removed at the
// test's cleanup.
//
// # Missing tools
//
// PostgreSQL is required: without it, tests fail (above), and the message starts with the
// one command that fixes a Debian or Ubuntu machine ([SetupCommand]: bash .ci/setup).
// Other tools are optional: a test that needs PgBouncer and does not find it calls
// [MissingTool], which skips the test naming that command, or fails it when
// PGXLOCK_TEST_STRICT=1 is set ([EnvStrict]; CI sets it), so that CI never passes with
// the proxy tests silently skipped.
//
// # Isolation
//
// Advisory locks are database-wide, so tests never share key numbers: [UniqueInt64] and
// [UniqueInt32] derive keys from the test name plus randomness. Tables go in a schema per
// test ([Schema]). Each pool gets an application_name unique to its test ([Config]), which
// is how [AdvisoryLocks] and the end-of-test check attribute locks in pg_locks to it.
//
// # The end-of-test lock check
//
// [NewPool] registers a cleanup that, before closing the pool, looks in pg_locks (through a
// separate connection) for advisory locks held or awaited by backends with the pool's
// application_name, and fails the test listing them. A backend whose client has just closed
// its connection may hold its locks for a few milliseconds more, so the check waits up to
// ten seconds (a loaded machine can be that slow) for them to go before it reports. Tests that deliberately orphan a holder
// (fault tests) should terminate it first, or build their pool with pgxpool directly.
// A check that cannot connect (the test broke the path to the server on purpose) is logged,
// not failed.
package pgtest
