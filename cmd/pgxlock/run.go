package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

const runSynopsis = "pgxlock run --key K [--try | --wait DURATION] [--shared] [--heartbeat 5s] [--grace 10s] [--foreground] [-v] [--ns NAME=ID]... -- COMMAND [ARGS...]"

// forwarded are the signals `run` passes on to the command. Before the
// command has started they abandon the wait instead (exit 128+N).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// runOptions are the flags of `pgxlock run`.
type runOptions struct {
	key        keys.Key
	try        bool
	wait       time.Duration
	shared     bool
	heartbeat  time.Duration
	grace      time.Duration
	foreground bool
	verbose    bool
	argv       []string
}

func cmdRun(ctx context.Context, args []string, s stdio, e env) int {
	o, code, ok := parseRunFlags(args, s, e)
	if !ok {
		return code
	}
	// Resolve the command before touching the lock: a typo must not take it.
	path, err := exec.LookPath(o.argv[0])
	if err != nil {
		s.msgf(s.Err, "pgxlock run: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotExec
	}

	// From here on, SIGINT, SIGTERM and SIGHUP are ours: they abandon the
	// wait for the lock, or are forwarded to the command once it runs.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// pgxlock's own messages go through notes: a stderr nobody reads must
	// hold back neither the signals nor what a lost lock calls for. The
	// command gets the stream itself. A broken pipe there fails the write
	// (EPIPE) rather than killing pgxlock: the status is the command's
	// (SIGPIPE is caught, not ignored, so the command gets its default).
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	msgs := newNotes(s.Err)
	defer msgs.close()
	s.child, s.Err = s.Err, msgs

	cfg, err := connConfig(e)
	if err != nil {
		s.msgf(s.Err, "pgxlock run: %v; the command was not run\n", err)
		return connFailed(err)
	}
	pcfg, err := pgxpool.ParseConfig("")
	if err != nil {
		s.msgf(s.Err, "pgxlock run: %v\n", err)
		return exitError
	}
	pcfg.ConnConfig = cfg
	// The wait is --wait's alone: a statement_timeout or lock_timeout from
	// the settings (DATABASE_URL, PGOPTIONS, the role's) would end it
	// early, as a timeout nobody asked for. As startup parameters they
	// override those of options=-c and outlast any reset.
	cfg.RuntimeParams["statement_timeout"] = "0"
	cfg.RuntimeParams["lock_timeout"] = "0"
	pcfg.AfterConnect = checkClientConnection
	// A signal while waiting for the lock ends the wait on the server too:
	// the advisory package sends a cancel request when a wait's context is
	// cancelled. checkClientConnection covers a pgxlock killed outright.
	// One connection holds the lock; a second one lets a busy or timed-out
	// run name the holders.
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		s.msgf(s.Err, "pgxlock run: %v\n", err)
		return exitUnavailable
	}
	defer pool.Close()
	hb := o.heartbeat
	if hb == 0 {
		hb = -1 // Config: negative disables the pings
	}
	// AllowProxy: acquire checks for a proxy itself, in the connect phase
	// (bounded by the connect timeout, not by --wait: see acquire).
	locker, err := advisory.New(pool, advisory.Config{HeartbeatInterval: hb, AllowProxy: true})
	if err != nil {
		s.msgf(s.Err, "pgxlock run: %v\n", err)
		return exitError
	}

	start := time.Now()
	h, code, ok := acquire(ctx, locker, o, sigs, s)
	if !ok {
		return code
	}
	if o.verbose {
		s.msgf(s.Err, "pgxlock run: acquired %s (%s) after %s\n", o.key, modeName(o.shared), fmtDuration(time.Since(start)))
	}
	held := time.Now()
	code, lost := supervise(h, path, o, sigs, s, e)
	if o.verbose && !lost {
		// After a loss supervise has said what happened; "released" would
		// contradict it.
		s.msgf(s.Err, "pgxlock run: released %s after %s\n", o.key, fmtDuration(time.Since(held)))
	}
	return code
}

func parseRunFlags(args []string, s stdio, e env) (runOptions, int, bool) {
	var o runOptions
	ns := namespaces{}
	if err := ns.addList(e.get(envNamespaces)); err != nil {
		return o, usageError(s, "run", "%s: %v", envNamespaces, err), false
	}
	var keyArg string
	fs := newFlagSet("run", runSynopsis, s.Err)
	fs.StringVar(&keyArg, "key", "", "the lock's key `K` (required; see the key syntax)")
	fs.BoolVar(&o.try, "try", false, "do not wait: exit 75 at once if the key is held")
	fs.DurationVar(&o.wait, "wait", 0, "wait at most `DURATION` for the lock, then exit 124 (default: wait until interrupted)")
	fs.BoolVar(&o.shared, "shared", false, "take the key in shared mode (excludes only exclusive holders)")
	fs.DurationVar(&o.heartbeat, "heartbeat", advisory.DefaultHeartbeatInterval,
		"ping the holding connection this often to notice a frozen server or a network partition (0: no pings; a terminated backend is noticed at once anyway)")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "after the lock is lost: time between SIGTERM and SIGKILL to the command")
	fs.BoolVar(&o.foreground, "foreground", false,
		"run the command in pgxlock's process group, so it can read the terminal (signals are then sent to the command's process only, not its children)")
	fs.BoolVar(&o.verbose, "v", false, "report acquisition and release on stderr")
	fs.Var(nsFlag{ns}, "ns", "name a namespace: `NAME=ID` (repeatable)")
	if code, ok := parseFlags(fs, args); !ok {
		return o, code, false
	}
	o.argv = fs.Args()
	waitGiven := false
	fs.Visit(func(f *flag.Flag) { waitGiven = waitGiven || f.Name == "wait" })
	switch {
	case keyArg == "":
		return o, usageError(s, "run", "--key is required"), false
	case len(o.argv) == 0:
		return o, usageError(s, "run", "no command given (pgxlock run --key K -- COMMAND [ARGS...])"), false
	case o.try && waitGiven:
		return o, usageError(s, "run", "--try and --wait exclude each other"), false
	case o.wait < 0 || waitGiven && o.wait == 0:
		return o, usageError(s, "run", "--wait must be positive (use --try not to wait)"), false
	case o.heartbeat < 0:
		return o, usageError(s, "run", "--heartbeat must not be negative"), false
	case o.grace < 0:
		return o, usageError(s, "run", "--grace must not be negative"), false
	}
	k, hashed, err := ns.parseKey(keyArg)
	if err != nil {
		return o, usageError(s, "run", "--key: %v", err), false
	}
	if hashed {
		fmt.Fprint(s.Err, hashNote("run", k))
	}
	o.key = k
	return o, 0, true
}

// checkClientConnection asks the server to check, every second, whether the
// client is still there while a statement runs (client_connection_check_interval,
// PostgreSQL 14+ on Linux, macOS and the BSDs). A backend waiting in
// pg_advisory_lock does not otherwise notice that its client went away: if
// pgxlock is killed while waiting (kill -9, a lost network), the wait would
// stay in pg_locks, queue other requests behind it and even be granted, until
// the holder lets go. Best effort: where the setting does not exist or is
// refused, the connection is used without it. The pool is pgxlock's own, so
// the session setting reaches nobody else.
func checkClientConnection(ctx context.Context, conn *pgx.Conn) error {
	_, _ = conn.Exec(ctx, "SELECT pg_catalog.set_config('client_connection_check_interval', '1s', false)")
	return nil
}

// detectProxy connects and checks, as the Locker's first session call
// would, that the pool reaches PostgreSQL directly: a proxy in between is
// advisory.ErrProxy.
func detectProxy(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoServer, err)
	}
	defer c.Release()
	proxied, err := advisory.DetectProxy(ctx, c.Conn())
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", errNoServer, err)
	case proxied:
		return advisory.ErrProxy
	}
	return nil
}

// errNoServer: run could not get a working connection before taking the lock.
var errNoServer = errors.New("cannot connect to the database")

// signalError is the cause of an acquisition abandoned because of a signal.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// acquire takes the lock, or gives up on a signal. On failure it has printed
// why and returns the exit status.
func acquire(ctx context.Context, locker *advisory.Locker, o runOptions, sigs <-chan os.Signal, s stdio) (*advisory.Lock, int, bool) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		h   *advisory.Lock
		err error
	}
	done := make(chan result, 1)
	go func() { // owned: its result is always received below
		opts := &advisory.Options{Shared: o.shared, Timeout: o.wait}
		var r result
		// Connect first, bounded by the connect timeout, not by --wait: a
		// server that cannot be reached or does not answer is unavailable
		// (69), never a busy key (75) or a lock timeout (124). The proxy
		// check (advisory.DetectProxy, which the Locker would otherwise run
		// inside the lock call's bound) is this round trip.
		if r.err = detectProxy(actx, locker.Pool()); r.err != nil {
			done <- r
			return
		}
		if o.try {
			r.h, r.err = locker.TryLock(actx, o.key, opts)
		} else {
			r.h, r.err = locker.Lock(actx, o.key, opts)
		}
		done <- r
	}()
	var r result
	var got os.Signal
	select {
	case r = <-done:
	case got = <-sigs:
		cancel(signalError{got})
		r = <-done
	}
	if got != nil {
		if r.err == nil {
			// Granted just as the signal came: give it back.
			_ = r.h.Unlock(context.Background())
		}
		s.msgf(s.Err, "pgxlock run: %s while waiting for %s; the command was not run\n", got, o.key)
		return nil, exitSignalBase + signalNumber(got), false
	}
	if r.err == nil {
		return r.h, 0, true
	}
	switch {
	case errors.Is(r.err, errNoServer), errors.Is(r.err, advisory.ErrNoConnection):
		// Checked first: a connection that could not be had (also one lost
		// between the ping and the lock) is unavailable (69), not a busy key
		// that timed out (124).
		s.msgf(s.Err, "pgxlock run: %v; the command was not run\n", r.err)
		return nil, exitUnavailable, false
	case errors.Is(r.err, advisory.ErrNotAcquired):
		s.msgf(s.Err, "pgxlock run: %s is busy%s; the command was not run\n", o.key, holders(ctx, locker.Pool(), o.key))
		return nil, exitBusy, false
	case errors.Is(r.err, advisory.ErrLockTimeout):
		s.msgf(s.Err, "pgxlock run: timed out after %s waiting for %s%s; the command was not run\n", o.wait, o.key, holders(ctx, locker.Pool(), o.key))
		return nil, exitTimeout, false
	default:
		s.msgf(s.Err, "pgxlock run: %v; the command was not run\n", r.err)
		return nil, exitUnavailable, false
	}
}

// holders names the sessions holding key, for the busy and timeout messages:
// ` (held by pid 123 "app")`. It is best effort: "" on any error.
func holders(ctx context.Context, pool *pgxpool.Pool, key keys.Key) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	locks, err := advisory.ListLocks(ctx, pool, key)
	if err != nil {
		return ""
	}
	var names []string
	for _, li := range locks {
		if li.Granted {
			names = append(names, fmt.Sprintf("pid %d %q", li.PID, li.ApplicationName))
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (held by " + strings.Join(names, ", ") + ")"
}

// supervise runs the command while h holds the lock, forwards signals to it,
// terminates it if the lock is lost, unlocks after it exits and returns the
// exit status, and whether the lock was lost.
func supervise(h *advisory.Lock, path string, o runOptions, sigs <-chan os.Signal, s stdio, e env) (int, bool) {
	cmd := exec.Command(path, o.argv[1:]...)
	cmd.Args[0] = o.argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.In, s.Out, s.childErr()
	cmd.Env = e
	cmd.SysProcAttr = sysProcAttr(o.foreground)
	// When Stdin/Stdout/Stderr are not files (tests), exec copies them through
	// pipes; a grandchild that keeps a pipe open must not keep us (and the
	// lock) forever once the command itself has exited.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		s.msgf(s.Err, "pgxlock run: %v\n", err)
		unlock(h, o, s)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound, false
		}
		return exitCannotExec, false
	}
	// In its own process group (unless --foreground), signals go to the whole
	// group, so that `sh -c '...'` and its children all get them.
	target := -cmd.Process.Pid
	if o.foreground {
		target = cmd.Process.Pid
	}
	send := func(sig syscall.Signal) { _ = syscall.Kill(target, sig) }

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // owned: received below before returning

	lostCh := h.Done()
	var (
		lost    bool
		killer  *time.Timer
		killing <-chan time.Time
	)
	defer func() {
		if killer != nil {
			killer.Stop()
		}
	}()
loop:
	for {
		select {
		case sig := <-sigs:
			send(sig.(syscall.Signal))
		case <-lostCh:
			lostCh = nil // Done closes only on loss until Unlock below
			lost = true
			s.msgf(s.Err, "pgxlock run: lock %s lost (%v); sending SIGTERM to the command, SIGKILL in %s\n", o.key, h.Err(), o.grace)
			send(syscall.SIGTERM)
			killer = time.NewTimer(o.grace)
			killing = killer.C
		case <-killing:
			killing = nil
			s.msgf(s.Err, "pgxlock run: the command outlived --grace %s; sending SIGKILL\n", o.grace)
			send(syscall.SIGKILL)
		case <-exited:
			// Wait's error says nothing ProcessState does not: a non-zero
			// status, or ErrWaitDelay after a grandchild kept a pipe open.
			break loop
		}
	}

	status := exitStatus(cmd.ProcessState)
	if uerr := unlock(h, o, s); uerr != nil && isLoss(uerr) && !lost {
		// The loss was found at unlock: the command ran, at least for a
		// while, without the lock.
		lost = true
	}
	if lost {
		s.msgf(s.Err, "pgxlock run: exiting %d: the lock was lost while the command ran (its status was %d)\n", exitLockLost, status)
		return exitLockLost, true
	}
	return status, false
}

// unlock releases h, reporting a failure on stderr. A loss is reported by
// the caller.
func unlock(h *advisory.Lock, o runOptions, s stdio) error {
	err := h.Unlock(context.Background())
	if err != nil && !isLoss(err) {
		// The library destroyed the connection: the server releases the
		// lock when the session ends.
		s.msgf(s.Err, "pgxlock run: unlock %s: %v\n", o.key, err)
	}
	return err
}

func isLoss(err error) bool {
	return errors.Is(err, advisory.ErrLockLost) || errors.Is(err, advisory.ErrNotHeld)
}

// exitStatus is the shell's view of how the command ended: its exit code, or
// 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitError
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	if c := ps.ExitCode(); c >= 0 {
		return c
	}
	return exitError
}

func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	n, _ := strconv.Atoi(sig.String())
	return n
}
