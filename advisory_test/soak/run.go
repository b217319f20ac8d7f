package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/tcpproxy"
)

// result is what a run found.
type result struct {
	Verdict   string // verdictOK, verdictFail or verdictUnknown
	Elapsed   time.Duration
	Acquired  int64
	Busy      int64
	Timeouts  int64
	Lost      int64          // ErrLockLost seen by the workers
	Unknown   int64          // sections whose end pg_locks never confirmed (open to the end of the history)
	Faults    map[string]int // injected, by kind
	Errors    map[string]int // by class
	Events    int            // operations in the checked history
	CheckTime time.Duration
	HTML      string // the visualisation, written when the check failed
	Killed    int    // workers the watchdog had to kill
}

// Verdicts.
const (
	verdictOK      = "linearizable"
	verdictFail    = "NOT linearizable"
	verdictUnknown = "unknown (checker timed out)"
)

// Linearizable reports whether the run passed.
func (r *result) Linearizable() bool { return r.Verdict == verdictOK }

// server is one PostgreSQL server the clients reach: through a proxy for the lock pools
// (cut by the netcut fault) and through another for the observers and the parent's admin
// pool (never cut). A failover points them at a new server.
type server struct {
	lock, obs *tcpproxy.Proxy
}

// workerProc is one running worker process.
type workerProc struct {
	index  int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr string        // file holding the worker's stderr
	exited chan struct{} // closed when Wait returned; err set then
	ready  atomic.Bool   // it printed its first stats line: it catches SIGUSR1
	err    error
}

// run performs one soak run, printing progress and the result to out. It returns an
// error when the run could not be carried out (no database, a worker that failed);
// a history that is not linearizable is a result, not an error.
func run(ctx context.Context, cfg config, out io.Writer) (*result, error) {
	if cfg.Procs < 1 || cfg.Goroutines < 1 || cfg.Keys < 1 || cfg.Duration <= 0 {
		return nil, errors.New("procs, goroutines, keys and duration must be positive")
	}
	var idb [4]byte
	_, _ = rand.Read(idb[:])
	runID := hex.EncodeToString(idb[:])
	faults := cfg.Faults
	if cfg.DSN != "" {
		if cfg.Standby {
			return nil, errors.New("-standby starts its own clusters: it cannot be used with -dsn")
		}
		if faults.has(faultRestart) || faults.has(faultFailover) {
			fmt.Fprintln(out, "soak: -dsn: restart and failover faults are off (the server is not ours to restart)")
		}
		faults = faults.without(faultRestart).without(faultFailover)
	}
	if !cfg.Standby && faults.has(faultFailover) {
		fmt.Fprintln(out, "soak: failover fault off (it needs -standby)")
		faults = faults.without(faultFailover)
	}
	if cfg.FaultEvery <= 0 {
		faults = nil
	}

	tmp, err := os.MkdirTemp("", "pgxlock-soak-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if cfg.Keep {
			fmt.Fprintf(out, "soak: histories kept in %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()

	// The database.
	db, err := startDB(ctx, cfg, out)
	if err != nil {
		return nil, err
	}
	defer db.stop()
	srv, err := db.proxies()
	if err != nil {
		return nil, err
	}
	defer closeServers(srv)
	hosts := func(lock bool) []string {
		var hs []string
		for _, s := range srv {
			p := s.obs
			if lock {
				p = s.lock
			}
			hs = append(hs, "127.0.0.1:"+strconv.Itoa(p.Port()))
		}
		return hs
	}
	readWrite := len(srv) > 1
	adminCfg, err := poolConfig(db.dsn, hosts(false), readWrite, "pgxlock-soak-"+runID+"-admin", 4)
	if err != nil {
		return nil, err
	}
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		return nil, err
	}
	defer admin.Close()

	keys := make([]int64, cfg.Keys)
	var kb [8]byte
	_, _ = rand.Read(kb[:])
	base := int64(binary.BigEndian.Uint64(kb[:]) >> 2) // room for the offsets below
	for i := range keys {
		keys[i] = base + int64(i)
	}

	// The workers.
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	st := newStats(cfg.Procs)
	var workers []*workerProc
	defer func() { // whatever happens: no worker outlives the run
		for _, w := range workers {
			select {
			case <-w.exited:
			default:
				_ = w.cmd.Process.Kill()
				<-w.exited
			}
		}
	}()
	lockApp := func(i int) string { return fmt.Sprintf("pgxlock-soak-%s-w%d", runID, i) }
	var journals []string
	for i := range cfg.Procs {
		spec := workerSpec{
			Index: i, DSN: db.dsn, LockHosts: hosts(true), ObsHosts: hosts(false), ReadWrite: readWrite,
			App: lockApp(i), Keys: keys, Goroutines: cfg.Goroutines,
			Journal: filepath.Join(tmp, fmt.Sprintf("worker%d.jsonl", i)), Seed: mrand.Uint64(),
			OpTimeout: cfg.OpTimeout, Heartbeat: cfg.Heartbeat, Multiplexed: cfg.Mux.multiplexed(i),
		}
		journals = append(journals, spec.Journal)
		w, err := startWorker(exe, spec, st)
		if err != nil {
			return nil, err
		}
		workers = append(workers, w)
	}
	fmt.Fprintf(out, "soak: %d processes x %d goroutines on %d keys for %v, multiplexing %s; faults every ~%v: %s\n",
		cfg.Procs, cfg.Goroutines, cfg.Keys, cfg.Duration, cfg.Mux.String(), cfg.FaultEvery, strings.Join(faults, ", "))

	// Faults and progress until the duration is over.
	var lockProxies []*tcpproxy.Proxy
	for _, s := range srv {
		lockProxies = append(lockProxies, s.lock)
	}
	in := &injector{
		admin: admin, lockApps: "pgxlock-soak-" + runID + "-w%", proxies: lockProxies, workers: workers,
		cutFor: 2*cfg.Heartbeat + time.Second, restart: db.restart, failover: db.failover,
		rng: mrand.New(mrand.NewPCG(mrand.Uint64(), 0)),
	}
	started := time.Now()
	end := started.Add(cfg.Duration)
	injected := map[string]int{}
	var mu sync.Mutex // injected
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(cfg.Report)
		defer t.Stop()
		last, lastAt := int64(0), started
		for {
			select {
			case <-stopProgress:
				return
			case now := <-t.C:
				tot := st.total()
				mu.Lock()
				f := fmtCounts(injected)
				mu.Unlock()
				fmt.Fprintf(out, "soak: %v: %.0f acq/s (%d acquired), faults {%s}, lost %d, errors {%s}\n",
					now.Sub(started).Round(time.Second), float64(tot.Acquired-last)/now.Sub(lastAt).Seconds(),
					tot.Acquired, f, tot.Lost, fmtCounts(tot.Errors))
				last, lastAt = tot.Acquired, now
			}
		}
	}()
	var faultErr error
	var order []string
	// short reports whether some kind was injected fewer than MinEach times.
	short := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range faults {
			n := injected[k]
			if k == faultCancel { // what the workers cancelled, not the signals sent
				n = int(st.total().Cancelled)
			}
			if n < cfg.MinEach {
				return true
			}
		}
		return false
	}
	for len(faults) > 0 && faultErr == nil {
		wait := time.Duration(float64(cfg.FaultEvery) * (0.5 + in.rng.Float64()))
		if time.Now().Add(wait).After(end) && !short() {
			break
		}
		select {
		case <-ctx.Done():
			faultErr = ctx.Err()
			continue
		case <-time.After(wait):
		}
		if len(order) == 0 { // every kind once per round, in a random order
			order = slices.Clone(faults)
			in.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		ok, err := in.inject(ctx, kind)
		if cfg.Verbose {
			fmt.Fprintf(out, "soak: %v: fault %s: injected %v %s\n", time.Since(started).Round(time.Millisecond), kind, ok, in.note)
		}
		in.note = ""
		if err != nil {
			faultErr = fmt.Errorf("inject %s: %w", kind, err)
		}
		if ok {
			mu.Lock()
			injected[kind]++
			mu.Unlock()
		} else {
			order = append(order, kind) // found nothing to hit: again later
		}
	}
	if faultErr == nil {
		select {
		case <-ctx.Done():
			faultErr = ctx.Err()
		case <-time.After(time.Until(end)):
		}
	}

	// Stop: the workers finish their operations (each bounded by OpTimeout, plus the
	// bounded wait that confirms a failed operation's lock is gone), then the watchdog.
	for _, w := range workers {
		_ = w.stdin.Close()
	}
	drain := cfg.OpTimeout + 45*time.Second
	watchdog := time.After(drain)
	res := &result{Faults: injected}
	for _, w := range workers {
		select {
		case <-w.exited:
		case <-watchdog:
			_ = w.cmd.Process.Kill()
			<-w.exited
			res.Killed++
		}
	}
	close(stopProgress)
	<-progressDone
	res.Elapsed = time.Since(started)
	tot := st.total()
	res.Acquired, res.Busy, res.Timeouts, res.Lost, res.Unknown, res.Errors = tot.Acquired, tot.Busy, tot.Timeouts, tot.Lost, tot.Unknown, tot.Errors
	injected[faultCancel] = int(tot.Cancelled) // what the workers cancelled, of in.signalled asked

	var werrs []error
	for _, w := range workers {
		diag, _ := os.ReadFile(w.stderr)
		if cfg.Verbose && len(diag) > 0 {
			fmt.Fprintf(out, "soak: worker %d diagnostics:\n%s", w.index, diag)
		}
		if w.err != nil {
			werrs = append(werrs, fmt.Errorf("worker %d: %v\n%s", w.index, w.err, diag))
		}
	}
	if res.Killed > 0 {
		werrs = append(werrs, fmt.Errorf("%d worker(s) did not stop within %v and were killed: the history is incomplete", res.Killed, drain))
	}
	if err := errors.Join(append(werrs, faultErr)...); err != nil {
		return nil, err
	}

	// The check.
	if err := check(cfg, journals, nil, res); err != nil {
		return nil, err
	}
	printResult(out, cfg, res, in.signalled)
	return res, nil
}

// poolConfig parses dsn, points it at hosts (host:port, tried in order) and, with
// readWrite, accepts only a server that takes writes (target_session_attrs=read-write).
func poolConfig(dsn string, hosts []string, readWrite bool, app string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cc := cfg.ConnConfig
	var fbs []*pgconn.FallbackConfig
	for _, h := range hosts {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			return nil, err
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, err
		}
		fbs = append(fbs, &pgconn.FallbackConfig{Host: host, Port: uint16(p), TLSConfig: cc.TLSConfig})
	}
	cc.Host, cc.Port, cc.TLSConfig, cc.Fallbacks = fbs[0].Host, fbs[0].Port, fbs[0].TLSConfig, fbs[1:]
	if readWrite {
		cc.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = app
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	cfg.MaxConns = maxConns
	return cfg, nil
}

// startWorker starts one worker process; its stdout (stats lines) feeds st.
func startWorker(exe string, spec workerSpec, st *stats) (*workerProc, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$") // a test binary runs no test; the soak binary ignores it
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	w := &workerProc{index: spec.Index, cmd: cmd, stderr: spec.Journal + ".stderr", exited: make(chan struct{})}
	f, err := os.Create(w.stderr)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	cmd.Stderr = f
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan struct{})
	go func() { // ends at the worker's exit (EOF)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var s workerStats
			if json.Unmarshal(sc.Bytes(), &s) == nil { // the worker prints nothing else there
				st.set(s)
				w.ready.Store(true)
			}
		}
	}()
	go func() { // owned: run waits for exited
		<-lines
		w.err = cmd.Wait()
		close(w.exited)
	}()
	return w, nil
}

// stats holds the latest counters of every worker.
type stats struct {
	mu sync.Mutex
	by []workerStats
}

func newStats(n int) *stats { return &stats{by: make([]workerStats, n)} }

func (s *stats) set(w workerStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Index >= 0 && w.Index < len(s.by) {
		s.by[w.Index] = w
	}
}

func (s *stats) total() workerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := workerStats{Errors: map[string]int{}}
	for _, w := range s.by {
		t.Acquired += w.Acquired
		t.Busy += w.Busy
		t.Timeouts += w.Timeouts
		t.Lost += w.Lost
		t.Cancelled += w.Cancelled
		t.Unknown += w.Unknown
		for k, n := range w.Errors {
			t.Errors[k] += n
		}
	}
	return t
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func printResult(out io.Writer, cfg config, r *result, signalled int) {
	fmt.Fprintf(out, "soak: done in %v: %d acquisitions (%.0f/s), %d busy, %d timeouts\n",
		r.Elapsed.Round(time.Millisecond), r.Acquired, float64(r.Acquired)/r.Elapsed.Seconds(), r.Busy, r.Timeouts)
	fmt.Fprintf(out, "soak: faults injected {%s} (cancel: %d of %d SIGUSR1 found an operation to cancel)\n",
		fmtCounts(r.Faults), r.Faults[faultCancel], signalled)
	fmt.Fprintf(out, "soak: losses detected (ErrLockLost): %d; operations whose end pg_locks never confirmed: %d\n", r.Lost, r.Unknown)
	fmt.Fprintf(out, "soak: errors by class {%s}\n", fmtCounts(r.Errors))
	fmt.Fprintf(out, "soak: history of %d operations checked in %v: %s\n", r.Events, r.CheckTime.Round(time.Millisecond), r.Verdict)
	if r.HTML != "" {
		fmt.Fprintf(out, "soak: visualisation: %s\n", r.HTML)
	}
}
