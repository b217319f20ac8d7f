// Command soak runs advisory locks under contention and random faults for a while, records
// every operation, and checks the merged history for linearizability with porcupine.
//
//	go run ./advisory_test/soak -procs 4 -goroutines 8 -duration 10m -standby
//
// N worker processes x M goroutines each contend on a few keys with every lock form
// (handle, Hold, WithLock, WithXactLock, and their Try forms; some shared, some with a
// short timeout), each process with its own pool. The parent injects faults at random
// (-faults): pg_terminate_backend of a holder, cancellation of a worker's operation
// (SIGUSR1 to the worker), a silent network cut (through a TCP proxy in front of the
// server) healed by a reset, a server restart, and with -standby a failover (the old
// primary is stopped in immediate mode, the standby promoted, a new standby built from
// it; clients reach the new primary through a multi-host configuration with
// target_session_attrs read-write).
//
// # What is checked
//
// Every worker records each operation with internal/history on the machine-wide
// monotonic clock: an acquire (call: the lock call starts; return: the section starts,
// or the call fails), then a release (from the section's end to the call's return) when
// the call succeeds. A call that fails after its section began records a Lost instead,
// from the acquire's call (the session may die between the grant and the section's
// start) to the moment pg_locks, read through a connection no fault touches, shows the
// key free of that worker's sessions (the server may release a dead session's lock
// after the client has seen the error). An acquire that fails before its
// section (cancelled, connection lost, lock timeout) is an unknown outcome settled the
// same way: it may have held the key for a moment, never after that. Busy results of Try
// calls are checked strictly (somebody held the key). The parent merges the histories
// and porcupine checks them against the exclusive/shared lock model, per key.
//
// A lock timeout is not checked as "somebody held the key": a blocking call queued in
// process behind an earlier call of its Locker times out while the key is free on the
// server when that earlier call is stuck (on a connection a network cut silenced, say).
// The first soak runs found this; advisory's gate documentation allows it.
//
// By default it starts its own throwaway cluster(s) from the local PostgreSQL binaries
// (internal/pglaunch). With -dsn it uses an existing server; restart and failover are
// then off.
//
// # Multiplexing
//
// -multiplexing says how the workers' Lockers hold their locks: off (the default, and the
// mode of every run before issue 22) builds them with advisory.Config{DisableMultiplexing:
// true}, so every held lock has a pooled connection of its own; on leaves the field at its
// default, so held locks (Lock, TryLock, Hold, TryHold) share holder connections; mixed
// gives even-numbered workers on and odd-numbered ones off, so both forms contend for the
// same keys. WithLock and the transaction forms are dedicated in every mode. The history
// is recorded and checked the same way in all three, and every fault kind applies: a
// terminated holder connection loses every lock on it, each recorded as a Lost by its
// own goroutine.
//
// It prints acquisitions/s, faults by kind, losses (ErrLockLost) and errors by class
// every -report and at the end, then the checker's verdict. The exit code is 0 only if
// the history is linearizable. The run stops by itself: after -duration the workers are
// told to stop and get a bounded drain, then a watchdog kills what is left; clusters,
// proxies and the temporary directory are removed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if raw := os.Getenv(workerEnv); raw != "" {
		os.Exit(worker(raw))
	}
	cfg := defaultConfig()
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	cfg.flags(fs)
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "soak: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
	if !res.Linearizable() {
		os.Exit(1)
	}
}

// config is a soak run's settings (the command's flags).
type config struct {
	Procs      int
	Goroutines int
	Keys       int
	Duration   time.Duration
	FaultEvery time.Duration // mean interval between faults
	Faults     faultSet
	MinEach    int // keep injecting past Duration until every enabled kind was injected this often
	DSN        string
	Standby    bool
	Report     time.Duration
	OpTimeout  time.Duration
	Heartbeat  time.Duration
	CheckLimit time.Duration
	HTML       string // where the visualisation goes on failure; "" means a file in os.TempDir
	Verbose    bool   // print the workers' stderr at the end
	Keep       bool   // keep the workers' histories (JSON lines) and print where
	Mux        muxMode
}

func defaultConfig() config {
	return config{
		Procs: 4, Goroutines: 8, Keys: 3,
		Duration: time.Minute, FaultEvery: 2 * time.Second,
		Faults: allFaults(), Report: 10 * time.Second,
		OpTimeout: 10 * time.Second, Heartbeat: 300 * time.Millisecond,
		CheckLimit: 5 * time.Minute,
	}
}

func (c *config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Procs, "procs", c.Procs, "worker processes")
	fs.IntVar(&c.Goroutines, "goroutines", c.Goroutines, "goroutines per worker process")
	fs.IntVar(&c.Keys, "keys", c.Keys, "contended keys")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long the workers run")
	fs.DurationVar(&c.FaultEvery, "fault-every", c.FaultEvery, "mean interval between faults (0: none)")
	fs.Var(&c.Faults, "faults", "faults to inject, comma-separated: "+strings.Join(faultNames, ",")+" (or all, none)")
	fs.IntVar(&c.MinEach, "min-each", 0, "run past -duration until every enabled fault kind was injected this many times")
	fs.StringVar(&c.DSN, "dsn", "", "use this server instead of a throwaway cluster (restart and failover are then off)")
	fs.BoolVar(&c.Standby, "standby", false, "start a primary and a streaming standby; enables the failover fault")
	fs.DurationVar(&c.Report, "report", c.Report, "interval between progress lines")
	fs.DurationVar(&c.OpTimeout, "op-timeout", c.OpTimeout, "bound on one operation")
	fs.DurationVar(&c.Heartbeat, "heartbeat", c.Heartbeat, "advisory heartbeat interval and timeout")
	fs.DurationVar(&c.CheckLimit, "check-timeout", c.CheckLimit, "bound on the linearizability check")
	fs.BoolVar(&c.Verbose, "v", false, "print the workers' diagnostics (first errors of unexpected classes) at the end")
	fs.BoolVar(&c.Keep, "keep", false, "keep the workers' recorded histories (JSON lines, internal/history) and print their directory")
	fs.Var(&c.Mux, "multiplexing", "how the workers hold locks: off (DisableMultiplexing: a connection per held lock), on (the Config default: shared holder connections) or mixed (even workers on, odd off)")
	fs.StringVar(&c.HTML, "html", "", "file for porcupine's visualisation if the check fails (default: a new file in the temp dir)")
}

// muxMode is the -multiplexing flag.
type muxMode string

const (
	muxOff   muxMode = "off"
	muxOn    muxMode = "on"
	muxMixed muxMode = "mixed"
)

func (m *muxMode) String() string {
	if *m == "" {
		return string(muxOff)
	}
	return string(*m)
}

func (m *muxMode) Set(s string) error {
	switch muxMode(s) {
	case muxOff, muxOn, muxMixed:
		*m = muxMode(s)
		return nil
	}
	return fmt.Errorf("unknown multiplexing mode %q (off, on, mixed)", s)
}

// multiplexed reports whether worker i runs with multiplexing on.
func (m muxMode) multiplexed(i int) bool {
	return m == muxOn || (m == muxMixed && i%2 == 0)
}
