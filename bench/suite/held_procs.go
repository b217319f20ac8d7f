package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

// The held section's processes workload: K keys spread over P OS processes
// (children of the suite, re-executed as the scaling section's are), each
// with a pool of heldPool and one Locker in the mode under test, each taking
// its K/P keys with TryLock one after another and holding them. While every
// child holds what it got, the parent counts each child's backends in
// pg_stat_activity (every child has its own application_name).

// heldChildEnv carries a held child's JSON spec; its presence makes a process
// such a child.
const heldChildEnv = "PGXLOCKBENCH_HELD_CHILD"

// HeldProcsResult is one mode of the processes workload.
type HeldProcsResult struct {
	Mode        string `json:"mode"`
	Procs       int    `json:"procs"`
	KeysPerProc int    `json:"keys_per_proc"`
	Pool        int    `json:"pool_per_proc"`
	Unavailable string `json:"unavailable,omitempty"`
	Held        int    `json:"held"` // handles held at once, all processes
	HeldPerProc []int  `json:"held_per_proc"`
	MaxBackends int    `json:"max_backends_per_proc"`
	MaxPinned   int    `json:"max_pinned_per_proc"` // backends holding advisory locks
	Backends    int    `json:"backends"`            // all processes
	Failed      int    `json:"failed_procs"`        // processes whose TryLocks stopped before their last key
	FirstError  string `json:"first_error,omitempty"`
	UnlockErrs  int    `json:"unlock_errors"`
}

type heldChildSpec struct {
	DSN  string `json:"dsn"`
	App  string `json:"app"`
	Mode string `json:"mode"`
	Pool int    `json:"pool"`
	Base int64  `json:"base"`
	N    int    `json:"n"`
}

type heldChildReport struct {
	Err        string `json:"err,omitempty"` // set-up failed
	Got        int    `json:"got"`
	FailedAt   int    `json:"failed_at"`
	FirstError string `json:"first_error,omitempty"`
	Acquired   int    `json:"acquired"`
	UnlockErrs int    `json:"unlock_errors"`
}

// heldChildMain runs a held child when this process is one; it returns
// otherwise. It reports what it holds (one JSON line), waits for a line on
// stdin, releases, and reports again.
func heldChildMain() {
	raw := os.Getenv(heldChildEnv)
	if raw == "" {
		return
	}
	out := json.NewEncoder(os.Stdout)
	var sp heldChildSpec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		_ = out.Encode(heldChildReport{Err: "bad spec: " + err.Error()})
		os.Exit(0)
	}
	ctx := context.Background()
	pool, err := heldPoolFor(ctx, &Env{DSN: sp.DSN}, sp.Pool, sp.App)
	if err != nil {
		_ = out.Encode(heldChildReport{Err: err.Error()})
		os.Exit(0)
	}
	l, err := advisory.New(pool, heldConfig(sp.Mode))
	if err != nil {
		_ = out.Encode(heldChildReport{Err: err.Error()})
		os.Exit(0)
	}
	var rep heldChildReport
	var hs []*advisory.Lock
	for i := range sp.N {
		h, err := l.TryLock(ctx, keys.Int64(sp.Base+int64(i)), nil)
		if err != nil {
			rep.FailedAt, rep.FirstError = i+1, err.Error()
			if errors.Is(err, advisory.ErrNoConnection) {
				rep.FirstError = "ErrNoConnection"
			}
			break
		}
		hs = append(hs, h)
	}
	rep.Got, rep.Acquired = len(hs), int(pool.Stat().AcquiredConns())
	_ = out.Encode(rep)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // the parent has counted (or died)
	for _, h := range hs {
		if err := h.Unlock(ctx); err != nil {
			rep.UnlockErrs++
		}
	}
	_ = out.Encode(rep)
	pool.Close()
	os.Exit(0)
}

func (s *Suite) runHeldProcs(ctx context.Context, mon *pgxpool.Pool) error {
	if !s.want("held", "processes") {
		return nil
	}
	procs, total := 8, 1000
	if s.cfg.Quick {
		procs, total = 4, 100
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for mi, mode := range []string{modeDedicated, modeMultiplexed} {
		t0 := time.Now()
		r := &HeldProcsResult{Mode: mode, Procs: procs, KeysPerProc: total / procs, Pool: heldPool}
		s.res.Held.Processes = append(s.res.Held.Processes, r)
		base := s.env.KeyBase + 4_000_000 + int64(mi)*100_000
		if err := s.heldProcs(ctx, mon, exe, r, base); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.Unavailable = err.Error()
		}
		s.logf("held processes: %s, %d x %d keys (%v)", mode, procs, total/procs, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

func (s *Suite) heldProcs(ctx context.Context, mon *pgxpool.Pool, exe string, r *HeldProcsResult, base int64) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		dec   *json.Decoder
		app   string
	}
	children := make([]*child, r.Procs)
	defer func() {
		for _, ch := range children {
			if ch != nil {
				ch.stdin.Close()
				_ = ch.cmd.Wait()
			}
		}
	}()
	for i := range children {
		sp := heldChildSpec{DSN: s.env.DSN, App: fmt.Sprintf("pgxlockbench-heldproc-%s-%d-%s", r.Mode, i, s.env.RunID),
			Mode: r.Mode, Pool: r.Pool, Base: base + int64(i*r.KeysPerProc), N: r.KeysPerProc}
		raw, err := json.Marshal(sp)
		if err != nil {
			return err
		}
		ch := &child{cmd: exec.CommandContext(cctx, exe), app: sp.App}
		ch.cmd.Env = append(os.Environ(), heldChildEnv+"="+string(raw))
		ch.cmd.Stderr = os.Stderr
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			return err
		}
		out, err := ch.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		ch.dec = json.NewDecoder(out)
		if err := ch.cmd.Start(); err != nil {
			return fmt.Errorf("start child: %w", err)
		}
		children[i] = ch
	}
	reps := make([]heldChildReport, len(children))
	for i, ch := range children {
		if err := ch.dec.Decode(&reps[i]); err != nil {
			return fmt.Errorf("child %d: %w", i, err)
		}
		if reps[i].Err != "" {
			return fmt.Errorf("child %d: %s", i, reps[i].Err)
		}
	}
	// Every child holds what it could; count.
	for i, ch := range children {
		backends, pinned, _, err := countApp(ctx, mon, ch.app)
		if err != nil {
			return err
		}
		rep := reps[i]
		r.Held += rep.Got
		r.HeldPerProc = append(r.HeldPerProc, rep.Got)
		r.Backends += backends
		r.MaxBackends, r.MaxPinned = max(r.MaxBackends, backends), max(r.MaxPinned, pinned)
		if rep.FailedAt > 0 {
			r.Failed++
			if r.FirstError == "" {
				r.FirstError = fmt.Sprintf("at key %d of %d: %s", rep.FailedAt, r.KeysPerProc, rep.FirstError)
			}
		}
	}
	for _, ch := range children {
		if _, err := io.WriteString(ch.stdin, "release\n"); err != nil {
			return err
		}
	}
	for i, ch := range children {
		var rep heldChildReport
		if err := ch.dec.Decode(&rep); err != nil {
			return fmt.Errorf("child %d: %w", i, err)
		}
		r.UnlockErrs += rep.UnlockErrs
	}
	return nil
}
