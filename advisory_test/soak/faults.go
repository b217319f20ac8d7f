package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/tcpproxy"
)

// The fault kinds.
const (
	faultTerminate = "terminate" // pg_terminate_backend of a random holder
	faultCancel    = "cancel"    // a worker cancels one of its operations (SIGUSR1)
	faultNetcut    = "netcut"    // every client connection silenced, then reset
	faultRestart   = "restart"   // pg_ctl restart -m fast of the primary
	faultFailover  = "failover"  // promote the standby, stop the old primary, new standby
)

var faultNames = []string{faultTerminate, faultCancel, faultNetcut, faultRestart, faultFailover}

// faultSet is the -faults flag: the enabled kinds, in faultNames order.
type faultSet []string

func allFaults() faultSet { return slices.Clone(faultSet(faultNames)) }

func (f *faultSet) String() string { return strings.Join(*f, ",") }

func (f *faultSet) Set(s string) error {
	switch s {
	case "all":
		*f = allFaults()
		return nil
	case "none", "":
		*f = nil
		return nil
	}
	var out faultSet
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(faultNames, name) {
			return fmt.Errorf("unknown fault %q (known: %s)", name, strings.Join(faultNames, ", "))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	*f = out
	return nil
}

func (f faultSet) has(name string) bool { return slices.Contains(f, name) }

func (f faultSet) without(name string) faultSet {
	return slices.DeleteFunc(slices.Clone(f), func(s string) bool { return s == name })
}

// injector injects the faults of one run. Its methods run on the fault loop's goroutine,
// one at a time; each returns whether a fault was injected.
type injector struct {
	admin     *pgxpool.Pool // direct (never cut)
	lockApps  string        // LIKE pattern of the workers' lock pools' application_name
	proxies   []*tcpproxy.Proxy
	workers   []*workerProc
	cutFor    time.Duration
	restart   func(context.Context) error // nil: not available
	failover  func(context.Context) error // nil: not available
	rng       *rand.Rand
	signalled int    // SIGUSR1 sent
	note      string // why the last fault was not injected (for -v)
}

func (in *injector) inject(ctx context.Context, kind string) (bool, error) {
	switch kind {
	case faultTerminate:
		return in.terminate(ctx)
	case faultCancel:
		return in.cancel(), nil
	case faultNetcut:
		return in.netcut(ctx), nil
	case faultRestart:
		fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		return true, in.restart(fctx)
	case faultFailover:
		fctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		return true, in.failover(fctx)
	}
	return false, fmt.Errorf("unknown fault %q", kind)
}

// terminate ends the backend of one random holder of an advisory lock among the workers'
// lock pools. It tries for up to half a second to find one.
func (in *injector) terminate(ctx context.Context) (bool, error) {
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var n int
		err := in.admin.QueryRow(qctx, `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
				SELECT pid FROM (
					SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
					WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE $1) holders
				ORDER BY random() LIMIT 1) victim`, in.lockApps).Scan(&n)
		cancel()
		if err != nil {
			// The server may be restarting or failing over: not this fault's business.
			in.note = err.Error()
			return false, nil
		}
		if n > 0 {
			return true, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			in.note = "no holder found"
			return false, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cancel asks a random worker to cancel one of its operations; the worker counts the
// cancellations it made.
func (in *injector) cancel() bool {
	w := in.workers[in.rng.IntN(len(in.workers))]
	if !w.ready.Load() || w.cmd.Process.Signal(syscall.SIGUSR1) != nil {
		return false
	}
	in.signalled++
	return true
}

// netcut silences every client connection for cutFor (longer than a heartbeat interval
// plus timeout, so holders notice), then resets them, so the server ends their sessions.
func (in *injector) netcut(ctx context.Context) bool {
	n := 0
	for _, p := range in.proxies {
		n += p.Cut()
	}
	in.note = fmt.Sprintf("%d connections cut", n)
	select {
	case <-ctx.Done():
	case <-time.After(in.cutFor):
	}
	for _, p := range in.proxies {
		p.CloseCut()
	}
	return n > 0
}
