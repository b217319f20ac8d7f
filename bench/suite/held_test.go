package suite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHeldQuick runs the quick mode of the held section and checks what holds
// in the dedicated form on any machine: one backend per held lock, each one
// lock-table entry; a pool of 10 refuses the eleventh TryLock with
// ErrNoConnection, in one process and in each of several; a pool of H+2 holds
// all H; TryLock+Unlock is two round trips; the hand-offs ran; the plot is
// written. The multiplexed rows are only checked to have run and to hold one
// lock-table entry per lock: their connection counts are what the section
// measures.
func TestHeldQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{Quick: true, NoPeers: true, Only: []string{"held"}, Out: out, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	h := res.Held
	if h == nil || len(h.Points) == 0 {
		t.Fatal("no held results")
	}
	for _, r := range h.Points {
		if r.Entries != r.Got || r.UnlockErrs != 0 {
			t.Errorf("%s H=%d pool %d: %d held, %d lock-table entries, %d unlock errors", r.Mode, r.Held, r.Pool, r.Got, r.Entries, r.UnlockErrs)
		}
		if r.Mode != modeDedicated {
			if r.Got == 0 {
				t.Errorf("%s H=%d: nothing held (%s)", r.Mode, r.Held, r.FirstError)
			}
			continue
		}
		want := min(r.Held, r.Pool)
		if r.Got != want || r.Backends != want || r.Pinned != want || r.Acquired != want {
			t.Errorf("dedicated H=%d pool %d: held %d, backends %d, holding %d, acquired %d; want %d each",
				r.Held, r.Pool, r.Got, r.Backends, r.Pinned, r.Acquired, want)
		}
		if r.Held > r.Pool && (r.FailedAt != r.Pool+1 || !r.NoConn) {
			t.Errorf("dedicated H=%d pool %d: first failure at %d (%s), want %d with ErrNoConnection", r.Held, r.Pool, r.FailedAt, r.FirstError, r.Pool+1)
		}
	}
	if len(h.Processes) != 2 {
		t.Errorf("%d processes rows", len(h.Processes))
	}
	for _, r := range h.Processes {
		if r.Unavailable != "" || r.UnlockErrs != 0 || len(r.HeldPerProc) != r.Procs {
			t.Errorf("processes %s: %q, %d unlock errors, %d processes reported", r.Mode, r.Unavailable, r.UnlockErrs, len(r.HeldPerProc))
			continue
		}
		if r.Mode == modeDedicated && (r.MaxBackends != heldPool || r.Held != r.Procs*heldPool || r.Failed != r.Procs) {
			t.Errorf("processes dedicated: most backends %d, held %d, %d failed; want %d, %d, %d",
				r.MaxBackends, r.Held, r.Failed, heldPool, r.Procs*heldPool, r.Procs)
		}
	}
	for _, r := range h.TryUnlock {
		if r.Unavailable != "" || r.Errors != 0 || r.Ops == 0 {
			t.Errorf("%s: %q, %d ops, %d errors (%s)", r.Row, r.Unavailable, r.Ops, r.Errors, r.FirstError)
		}
		if r.Row == heldTryContender(modeDedicated, 0, 0).Name && r.RTPerOp != 2 {
			t.Errorf("%s: %.2f round trips per cycle, want 2", r.Row, r.RTPerOp)
		}
	}
	for _, r := range h.Handoff {
		if r.Errors != 0 || r.Handoff.N == 0 {
			t.Errorf("hand-off %s: %d hand-offs, %d errors (%s)", r.Mode, r.Handoff.N, r.Errors, r.FirstError)
		}
	}
	if st, err := os.Stat(filepath.Join(out, "held-connections.png")); err != nil || st.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}
