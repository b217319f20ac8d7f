package history

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// EndUnknownBy records the return of the operation now with an [Unknown] outcome whose
// effect, whatever it was, is over by now: the client does not know whether an Acquire
// took the lock, but has seen (in pg_locks, through another connection) that the
// session it tried on no longer holds the key. The checker then relaxes only the Busy
// and Timeout results that overlap the operation's call..return, not every later one on
// the key, and a Release settled this way returns at its Return rather than at the end
// of the history: long histories (the soak command's) stay checkable and keep their
// power. End(Unknown, 0) is the form for an outcome never settled.
func (p *Pending) EndUnknownBy() {
	now := Now()
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	op := &p.r.ops[p.i]
	op.Outcome, op.Return = Unknown, now
	p.r.emit(*op)
}

// WriteHTML writes porcupine's visualisation of v to path (for programs, which have no
// testing.TB for [SaveHTML]).
func (v Verdict) WriteHTML(path string) error {
	if err := porcupine.VisualizePath(v.model, v.info, path); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}
