package history

// Attempt records one client's acquisition of one or more keys and what followed, as
// the lock model reads it: an Acquire and a Release per key, and a Lost when the lock
// may have gone early. It suits callback APIs (WithLock: the acquisition returns when
// the callback starts, the release begins when it returns) and handles alike.
//
// Its methods are called in order by one goroutine: Acquired or Failed, then Lost if
// need be, Releasing, Released. Each step is recorded once; a later call of it, or one
// out of order (Releasing before Acquired), records nothing. A nil *Attempt records
// nothing, so code can be instrumented conditionally.
type Attempt struct {
	rec      *Recorder
	client   string
	keys     []string
	call     int64 // the acquisition's call
	acq      []*Pending
	rel      []*Pending
	done     bool // the acquisition has ended
	held     bool // it returned the lock
	released bool // the release has ended
}

// Attempt records now the call of an acquisition of keys by client (shared: in shared
// mode). Use one client name per attempt unless the same holder acts again.
func (r *Recorder) Attempt(client string, keys []string, shared bool) *Attempt {
	a := &Attempt{rec: r, client: client, keys: keys}
	for _, k := range keys {
		a.acq = append(a.acq, r.Begin(Op{Client: client, Key: k, Kind: Acquire, Shared: shared}))
	}
	if len(a.acq) > 0 {
		a.call = a.acq[0].Call()
	}
	return a
}

// Held reports whether the acquisition returned the lock.
func (a *Attempt) Held() bool { return a != nil && a.held }

// Acquired records that the acquisition returned the lock (e.g. its callback started).
func (a *Attempt) Acquired() {
	if a == nil || a.done {
		return
	}
	a.done, a.held = true, true
	for _, p := range a.acq {
		p.End(OK, 0)
	}
}

// Failed records that the acquisition ended without the lock, with out (Busy, Timeout
// or Unknown). With several keys a Busy or Timeout becomes Unknown: which key was busy
// is not known, and some may have been taken and given back.
func (a *Attempt) Failed(out Outcome) {
	if a == nil || a.done {
		return
	}
	a.done = true
	if len(a.keys) > 1 {
		out = Unknown
	}
	for _, p := range a.acq {
		p.End(out, 0)
	}
}

// Lost records that the lock may have gone at any moment after the acquisition's call
// and before until (a reading of [Now] at which the keys were known free; 0: not
// known). See [Recorder.Lost].
func (a *Attempt) Lost(until int64) {
	if a == nil || !a.held || a.released {
		return
	}
	for _, k := range a.keys {
		a.rec.Lost(a.client, k, a.call, until)
	}
}

// Releasing records the call of the release (e.g. the callback returned).
func (a *Attempt) Releasing() {
	if a == nil || !a.held || a.rel != nil || a.released {
		return
	}
	for _, k := range a.keys {
		a.rel = append(a.rel, a.rec.Begin(Op{Client: a.client, Key: k, Kind: Release}))
	}
}

// Released records the return of the release: OK if the call that releases succeeded
// (the unlock reported the lock held until then), else Unknown.
func (a *Attempt) Released(ok bool) {
	if a == nil || !a.held || a.released {
		return
	}
	a.Releasing()
	a.released = true
	out := Unknown
	if ok {
		out = OK
	}
	for _, p := range a.rel {
		p.End(out, 0)
	}
}
