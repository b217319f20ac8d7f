package pglaunch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrStopped is returned by [Cluster.Restart] after [Cluster.Stop].
var ErrStopped = errors.New("pglaunch: cluster stopped")

// Options configures [Start]. The zero value starts a cluster from the binaries
// [FindBinDir] finds, as OS user "postgres" when the process is root.
type Options struct {
	// BinDir holds initdb, pg_ctl and postgres. "" means [FindBinDir].
	BinDir string
	// OSUser runs initdb and the server when the process is root (initdb refuses root).
	// "" means "postgres". Ignored when the process is not root.
	OSUser string
	// Settings are extra postgresql.conf settings (name = value), applied after the
	// defaults so they can override them (e.g. max_connections, deadlock_timeout).
	// port, listen_addresses and unix_socket_directories belong to Start and are refused.
	Settings map[string]string
	// Log, when set, receives progress lines (timings, port) and, at Stop, the server log.
	Log io.Writer
	// NoTemplateCache makes every Start run initdb instead of copying a cached template
	// data directory.
	NoTemplateCache bool
	// CacheDir holds template data directories. "" means <os.UserCacheDir()>/pglaunch.
	CacheDir string
}

// Cluster is a running throwaway PostgreSQL cluster. Its methods are safe for concurrent
// use. Stop it with [Cluster.Stop]; a process that exits without doing so leaves the server
// running until the next [Start] on the machine reaps it.
type Cluster struct {
	binDir  string
	dir     string // temporary directory: data/, server.log, socket, owner file
	dataDir string
	logFile string
	port    int
	r       *runner
	log     io.Writer
	// settings are Options.Settings, which a standby of this cluster inherits.
	settings map[string]string
	// standby is set on a cluster made by StartStandby (replication state); nil otherwise.
	standby *standbyState

	mu      sync.Mutex
	stopped bool
	stopErr error
}

// Start creates and starts a throwaway cluster: a fresh data directory (initdb, or a copy
// of the cached template) in a new temporary directory, a free port on 127.0.0.1, trust
// authentication for user "postgres". ctx bounds the whole start, including the programs
// it runs. On error nothing is left behind; a failing program's output is in the error (a
// *[CommandError]).
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	start := time.Now()
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	if !hasServerBinaries(binDir) {
		return nil, fmt.Errorf("%w in %s (need initdb, pg_ctl and postgres)", ErrNoBinaries, binDir)
	}
	if err := checkSettings(opts.Settings); err != nil {
		return nil, err
	}
	r, err := newRunner(opts.OSUser, opts.Log)
	if err != nil {
		return nil, err
	}
	reapOrphans(r)

	dir, err := makeClusterDir(r)
	if err != nil {
		return nil, err
	}
	r.dir = dir
	c := &Cluster{
		binDir:   binDir,
		dir:      dir,
		dataDir:  filepath.Join(dir, "data"),
		logFile:  filepath.Join(dir, "server.log"),
		r:        r,
		log:      opts.Log,
		settings: opts.Settings,
	}
	ok := false
	defer func() {
		if !ok {
			// Fresh context: the caller's may be what failed.
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = c.Stop(cctx)
		}
	}()

	tc := newTemplateCache(opts, binDir)
	fromTemplate, err := c.prepareData(ctx, tc)
	if err != nil {
		return nil, err
	}
	prepared := time.Now()
	err = c.configureAndStart(ctx, opts.Settings)
	if err != nil && fromTemplate && ctx.Err() == nil {
		// Either the settings are bad or the cache entry is damaged. Try a fresh initdb:
		// if that starts, the entry was at fault and goes, so it cannot break every later
		// start; if not, the entry stays and the error is the settings'.
		r.logf("start from cached template failed, trying initdb: %v", err)
		if rmErr := os.RemoveAll(c.dataDir); rmErr != nil {
			return nil, errors.Join(err, rmErr)
		}
		if fromTemplate, err = c.prepareData(ctx, nil); err != nil {
			return nil, err
		}
		prepared = time.Now()
		if err = c.configureAndStart(ctx, opts.Settings); err == nil {
			r.logf("discarded damaged template cache entry %s", tc.entry)
			tc.invalidate()
		}
	}
	if err != nil {
		return nil, err
	}
	how := "initdb"
	if fromTemplate {
		how = "template copy"
	}
	r.logf("cluster on port %d in %s: %s %v, start %v, total %v", c.port, c.dir, how,
		prepared.Sub(start).Round(time.Millisecond), time.Since(prepared).Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond))
	ok = true
	return c, nil
}

// DSN returns a connection string for database "postgres" as user "postgres" over TCP on
// 127.0.0.1 (TCP so that tests can put proxies in front of it).
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port returns the server's TCP port on 127.0.0.1. It stays the same across Restart.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the cluster's data directory (removed by Stop).
func (c *Cluster) DataDir() string { return c.dataDir }

// Restart stops the server in fast mode (open sessions are terminated) and starts it
// again on the same port and data, waiting until it accepts connections. ctx bounds the
// pg_ctl call. It returns ErrStopped after Stop.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	t0 := time.Now()
	_, err := c.r.run(ctx, c.bin("pg_ctl"), "restart", "-D", c.dataDir, "-m", "fast", "-w",
		"-t", pgctlTimeout(ctx), "-l", c.logFile, "-s")
	if err != nil {
		return c.withLogTail(err)
	}
	c.r.logf("restarted port %d in %v", c.port, time.Since(t0).Round(time.Millisecond))
	return nil
}

// Stop stops the server (immediate mode: sessions are cut, nothing is flushed) and removes
// the temporary directory. Stopping a primary this way is how a test kills it before
// promoting its standby: its clients see their connections end. If pg_ctl fails or ctx ends, the postmaster is signalled
// directly, so the server is gone whatever ctx does. Stop is idempotent: later calls return
// the first call's result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	err := c.stopServer(ctx)
	if c.log != nil {
		if b, rerr := os.ReadFile(c.logFile); rerr == nil && len(b) > 0 {
			fmt.Fprintf(c.log, "pglaunch: server log of port %d:\n%s", c.port, b)
		}
	}
	c.stopErr = errors.Join(err, os.RemoveAll(c.dir))
	return c.stopErr
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.binDir, name) }

// configureAndStart writes the settings and starts the server, retrying with a new port
// when the one picked was taken in the meantime.
func (c *Cluster) configureAndStart(ctx context.Context, extra map[string]string) error {
	conf := filepath.Join(c.dataDir, "postgresql.conf")
	const include = "\n# Added by pglaunch.\ninclude 'pglaunch.conf'\n"
	// A standby's data directory is a copy of its primary's: the include is there.
	if b, err := os.ReadFile(conf); err != nil || !strings.Contains(string(b), include) {
		f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("pglaunch: %w", err)
		}
		_, err = f.WriteString(include)
		if err = errors.Join(err, f.Close()); err != nil {
			return fmt.Errorf("pglaunch: %w", err)
		}
	}

	const attempts = 5
	for attempt := 1; ; attempt++ {
		port, err := pickPort()
		if err != nil {
			return fmt.Errorf("pglaunch: pick a free port: %w", err)
		}
		if err := c.r.writeFile(filepath.Join(c.dataDir, "pglaunch.conf"), settingsFile(c.dir, port, extra), 0o600); err != nil {
			return fmt.Errorf("pglaunch: %w", err)
		}
		_ = os.Remove(c.logFile) // one log per attempt, so the clash check reads this one
		_, err = c.r.run(ctx, c.bin("pg_ctl"), "start", "-D", c.dataDir, "-l", c.logFile, "-w",
			"-t", pgctlTimeout(ctx), "-s")
		if err == nil {
			c.port = port
			return nil
		}
		err = c.withLogTail(err)
		// pg_ctl may have given up on a server that is still starting.
		_ = c.stopServer(context.WithoutCancel(ctx))
		if attempt < attempts && ctx.Err() == nil && strings.Contains(c.logTail(), "already in use") {
			c.r.logf("port %d taken, retrying with another", port)
			continue
		}
		return err
	}
}

// stopServer stops the postmaster if one runs: pg_ctl stop -m immediate, then signals if
// that fails. Returns nil once no postmaster of this data directory runs.
func (c *Cluster) stopServer(ctx context.Context) error {
	pid, ok := postmasterPID(c.dataDir)
	if !ok {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := c.r.run(cctx, c.bin("pg_ctl"), "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "30", "-s")
	// pg_ctl returns when postmaster.pid is gone, a moment before the process is.
	if err == nil && waitGone(pid, 5*time.Second) {
		return nil
	}
	if killErr := killPostmaster(pid, c.dataDir); killErr != nil {
		return errors.Join(err, killErr)
	}
	return nil
}

// withLogTail appends the end of the server log to a CommandError's output.
func (c *Cluster) withLogTail(err error) error {
	var ce *CommandError
	if tail := c.logTail(); tail != "" && errors.As(err, &ce) {
		ce.Output = strings.TrimSpace(ce.Output) + "\nserver log (" + c.logFile + ", last lines):\n" + tail
	}
	return err
}

// logTail returns the last few KiB of the server log.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return ""
	}
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// pickPort returns a TCP port free on 127.0.0.1 at the time of the call. A variable so
// tests can simulate a port taken between pick and start.
var pickPort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// pgctlTimeout is pg_ctl's -t in seconds: the context's remaining time, capped at 60.
func pgctlTimeout(ctx context.Context) string {
	secs := 60.0
	if dl, ok := ctx.Deadline(); ok {
		secs = math.Min(secs, math.Ceil(time.Until(dl).Seconds()))
	}
	return strconv.Itoa(int(math.Max(secs, 1)))
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// reservedSettings are decided by Start.
var reservedSettings = map[string]bool{"port": true, "listen_addresses": true, "unix_socket_directories": true}

func checkSettings(s map[string]string) error {
	for name, value := range s {
		if strings.ContainsAny(value, "\x00\r\n") {
			return fmt.Errorf("pglaunch: setting %q: value contains a line break or NUL", name)
		}
		if !settingName.MatchString(name) {
			return fmt.Errorf("pglaunch: invalid setting name %q", name)
		}
		if reservedSettings[strings.ToLower(name)] {
			return fmt.Errorf("pglaunch: setting %q is chosen by Start and cannot be overridden", name)
		}
	}
	return nil
}

// settingsFile renders pglaunch.conf: the defaults for a throwaway test cluster, then the
// caller's settings (later lines win in postgresql.conf).
func settingsFile(dir string, port int, extra map[string]string) []byte {
	var b strings.Builder
	b.WriteString("# Written by pglaunch: a throwaway cluster for tests. Durability is off.\n")
	kv := func(name, value string) { fmt.Fprintf(&b, "%s = %s\n", name, quoteConf(value)) }
	kv("listen_addresses", "127.0.0.1")
	kv("port", strconv.Itoa(port))
	kv("unix_socket_directories", dir)
	kv("fsync", "off")
	kv("synchronous_commit", "off")
	kv("full_page_writes", "off")
	kv("max_connections", "200")
	kv("shared_buffers", "32MB")
	kv("logging_collector", "off")
	kv("log_min_messages", "warning")
	kv("log_checkpoints", "off")
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		kv(name, extra[name])
	}
	return []byte(b.String())
}

// quoteConf quotes a postgresql.conf value: single quotes doubled, backslashes escaped.
func quoteConf(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}
