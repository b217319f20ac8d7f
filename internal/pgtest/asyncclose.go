package pgtest

import (
	"runtime"
	"strings"
	"time"
)

// pgxAsyncCloseCreator is the line a goroutine's stack ends with when pgx started it to
// close a connection in the background: (*PgConn).asyncClose, used after a query was
// interrupted (a cancelled context, a deadline, a broken read). It sends a cancel request
// on a new connection, then Terminate, then reads the socket until the server closes it,
// bounded by a 15 s deadline of its own (pgconn.go). Over TLS, or to a server that no
// longer answers, that drain can outlast the tests by seconds.
const pgxAsyncCloseCreator = "created by github.com/jackc/pgx/v5/pgconn.(*PgConn).asyncClose"

// asyncCloseBound is how long Main waits for pgx's background closes to end: pgx's own
// 15 s deadline plus slack for a loaded machine. One still running after it is reported
// by the leak check like any other goroutine.
const asyncCloseBound = 20 * time.Second

// countAsyncCloses returns how many goroutines pgx's asyncClose started are running now.
func countAsyncCloses() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	// runtime.Stack separates goroutines with a blank line.
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "\n"+pgxAsyncCloseCreator+" ") || strings.Contains(g, "\n"+pgxAsyncCloseCreator+"\n") {
			count++
		}
	}
	return count
}

// awaitAsyncCloses waits, at most bound, until no goroutine started by pgx's asyncClose
// is running, and returns how many still run. It waits for exactly those goroutines:
// every other goroutine is left to the leak check.
func awaitAsyncCloses(bound time.Duration) int {
	deadline := time.Now().Add(bound)
	for {
		n := countAsyncCloses()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond) // polling goroutine state: there is no event to wait on
	}
}
