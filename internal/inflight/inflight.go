// Package inflight counts the connection releases that run in the
// background (pooltx.Conn.ReleaseAsync), so that a test can wait, on an
// event rather than a poll, until every connection a call handed back has
// reached its pool or been destroyed.
package inflight

import "sync"

var (
	mu   sync.Mutex
	n    int
	zero = sync.NewCond(&mu)
)

// Start records a release that is about to run in the background. It must
// be called before the goroutine that runs it starts.
func Start() {
	mu.Lock()
	n++
	mu.Unlock()
}

// Done records the end of a release recorded by Start.
func Done() {
	mu.Lock()
	n--
	if n == 0 {
		zero.Broadcast()
	}
	mu.Unlock()
}

// Wait returns once no release recorded by Start is still running: every
// one started before Wait was called has ended (as have any started since).
func Wait() {
	mu.Lock()
	for n > 0 {
		zero.Wait()
	}
	mu.Unlock()
}
