package suite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestScalingQuick runs the quick mode of the scaling section and checks what
// holds on any machine: the replicas (child processes) ran and none of them
// broke mutual exclusion across processes, every key taken shows up as one
// lock-table entry, raw pgx's waiters starve the pool of unrelated queries
// at 64 waiters while the library's do not, and the three plots are written.
func TestScalingQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{Quick: true, NoPeers: true, Only: []string{"scaling"}, Out: out, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	sc := res.Scaling
	if sc == nil {
		t.Fatal("no scaling results")
	}
	procs := 0
	for _, r := range sc.Processes {
		if r.Peer {
			continue
		}
		if r.Unavailable != "" {
			t.Errorf("%s %s: %s", r.Config, r.Row, r.Unavailable)
			continue
		}
		procs++
		if r.Violations != 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d violations, %d errors (%s)", r.Config, r.Row, r.Violations, r.Errors, r.FirstError)
		}
		if len(r.Counts) != r.Config.Procs || r.Acquisitions == 0 {
			t.Errorf("%s %s: %d acquisitions from %d processes", r.Config, r.Row, r.Acquisitions, len(r.Counts))
		}
	}
	if procs == 0 {
		t.Error("no processes row ran")
	}
	if len(sc.Keys) == 0 || sc.LockTable == nil || sc.LockTable.Nominal <= 0 {
		t.Errorf("keys: %d rows, lock table %+v", len(sc.Keys), sc.LockTable)
	}
	for _, r := range sc.Keys {
		if r.Skipped == "" && (r.Entries != r.Keys || r.Errors != 0) {
			t.Errorf("keys %d %s: %d lock-table entries, %d errors (%s)", r.Keys, r.Row, r.Entries, r.Errors, r.FirstError)
		}
	}
	var lib, raw = -1.0, -1.0
	for _, r := range sc.Pinned {
		if r.Waiters == 64 {
			switch r.Impl {
			case "pgxlock":
				lib = r.Ratio
			case "raw pgx":
				raw = r.Ratio
			}
		}
	}
	// Structural: 64 raw waiters pin all 10 connections, the library's one.
	if lib < 0.5 || raw < 0 || raw > 0.5 {
		t.Errorf("unrelated queries with 64 waiters: pgxlock %.2fx, raw %.2fx of baseline", lib, raw)
	}
	for _, f := range []string{"scaling-processes.png", "scaling-keys.png", "scaling-pinned.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
}
