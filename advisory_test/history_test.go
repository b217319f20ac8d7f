package advisory_test

import (
	"fmt"

	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/keys"
)

// attempt records, for the linearizability check, one client's acquisition of one or
// more keys and what followed: an Acquire and a Release per key, and a Lost when the
// lock may have gone early. Methods are called in order by one goroutine; each step is
// recorded once, later calls of it are ignored. A nil *attempt records nothing.
type attempt struct {
	rec    *history.Recorder
	client string
	keys   []string
	shared bool
	call   int64 // the acquisition's call
	acq    []*history.Pending
	rel    []*history.Pending
	got    bool // the acquisition returned the lock
	done   bool // the acquisition has ended
}

// beginAttempt records the call of an acquisition of ks by client.
func beginAttempt(rec *history.Recorder, client string, ks []keys.Key, shared bool) *attempt {
	a := &attempt{rec: rec, client: client, shared: shared}
	for _, k := range ks {
		a.keys = append(a.keys, fmt.Sprint(k))
	}
	for _, k := range a.keys {
		a.acq = append(a.acq, rec.Begin(history.Op{Client: client, Key: k, Kind: history.Acquire, Shared: shared}))
	}
	a.call = a.acq[0].Call()
	return a
}

// acquired records that the acquisition returned the lock (e.g. its callback started).
func (a *attempt) acquired() {
	if a == nil || a.done {
		return
	}
	a.done, a.got = true, true
	for _, p := range a.acq {
		p.End(history.OK, 0)
	}
}

// failed records that the acquisition ended without the lock: Busy or Timeout only
// where one key makes the outcome certain, Unknown otherwise.
func (a *attempt) failed(out history.Outcome) {
	if a == nil || a.done {
		return
	}
	a.done = true
	if len(a.keys) > 1 && out != history.Unknown {
		out = history.Unknown // which key was busy is not known; some may have been taken and given back
	}
	for _, p := range a.acq {
		p.End(out, 0)
	}
}

// releasing records the call of the release (e.g. the callback returned).
func (a *attempt) releasing() {
	if a == nil || !a.got || a.rel != nil {
		return
	}
	for _, k := range a.keys {
		a.rel = append(a.rel, a.rec.Begin(history.Op{Client: a.client, Key: k, Kind: history.Release}))
	}
}

// released records the return of the release: OK if the call that releases succeeded,
// else Unknown.
func (a *attempt) released(ok bool) {
	if a == nil || !a.got {
		return
	}
	a.releasing()
	out := history.Unknown
	if ok {
		out = history.OK
	}
	for _, p := range a.rel {
		p.End(out, 0)
	}
	a.rel = a.rel[:0:0]
	a.got = false
}

// lost records that the lock may have gone at any moment after the acquisition's call
// and before until (0: not known).
func (a *attempt) lost(until int64) {
	if a == nil || !a.got {
		return
	}
	for _, k := range a.keys {
		a.rec.Lost(a.client, k, a.call, until)
	}
}
