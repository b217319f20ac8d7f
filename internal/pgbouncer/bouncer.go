package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoBinary is returned (wrapped) by [Start] when the pgbouncer binary is not installed.
var ErrNoBinary = errors.New("pgbouncer: binary not found; run: bash .ci/setup (it installs it: apt-get install -y pgbouncer)")

// errExited: the process exited before accepting connections (Start's readiness wait).
var errExited = errors.New("pgbouncer: process exited")

// Pool modes accepted in [Options.PoolMode].
const (
	PoolTransaction = "transaction"
	PoolSession     = "session"
	PoolStatement   = "statement"
)

// Options configures [Start]. Upstream is required.
type Options struct {
	// Upstream is the DSN of the PostgreSQL server to put PgBouncer in front of, as pgx
	// accepts it (URL or key=value). Its host, port, user, password and database are used;
	// a unix-socket host (a path) works too. TLS settings are not carried over: PgBouncer
	// talks to the server without TLS.
	Upstream string

	// PoolMode is PgBouncer's pool_mode: "transaction" (the default when empty),
	// "session" or "statement".
	PoolMode string

	// PoolSize is default_pool_size: server connections per user and database pair.
	// Zero means 20.
	PoolSize int

	// OSUser runs pgbouncer when the process is root (PgBouncer refuses root). "" means
	// "postgres", or "nobody" when there is no such user. Ignored when not root.
	OSUser string

	// Binary is the pgbouncer executable. "" means the lookup described in the package
	// documentation.
	Binary string

	// Settings are extra [pgbouncer] settings (name = value), written after the defaults
	// so they override them. listen_addr, listen_port, unix_socket_dir, pidfile, logfile
	// and auth_file belong to Start and are refused.
	Settings map[string]string
}

// Bouncer is a running PgBouncer. Its methods are safe for concurrent use.
type Bouncer struct {
	dir     string
	port    int
	user    string
	db      string
	version string
	logFile string
	stderr  *tailBuffer

	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd.Wait has returned

	stopOnce sync.Once
	stopErr  error
}

// dirPrefix names bouncer directories in the temporary directory.
const dirPrefix = "pgbouncer-"

// ownerFile, in a bouncer's directory, holds the PID of the process that started it.
const ownerFile = "owner.pid"

var reserved = map[string]bool{
	"listen_addr": true, "listen_port": true, "unix_socket_dir": true,
	"pidfile": true, "logfile": true, "auth_file": true,
}

// Start runs a PgBouncer in front of opts.Upstream and returns once a client can connect
// through it and run a query. ctx bounds the whole start (30 s when it has no deadline).
// On error nothing is left behind and the error carries the end of PgBouncer's log.
func Start(ctx context.Context, opts Options) (*Bouncer, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	// Options are checked before the binary is looked up: a bad option is the
	// caller's mistake on every machine, with PgBouncer installed or not.
	mode := opts.PoolMode
	if mode == "" {
		mode = PoolTransaction
	}
	if mode != PoolTransaction && mode != PoolSession && mode != PoolStatement {
		return nil, fmt.Errorf("pgbouncer: unknown pool mode %q", opts.PoolMode)
	}
	for name := range opts.Settings {
		if reserved[strings.ToLower(name)] {
			return nil, fmt.Errorf("pgbouncer: setting %q is chosen by Start and cannot be overridden", name)
		}
	}
	up, err := pgconn.ParseConfig(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: parse upstream DSN: %w", err)
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, err
	}
	version, err := binaryVersion(ctx, bin)
	if err != nil {
		return nil, err
	}
	run, err := newRunAs(opts.OSUser)
	if err != nil {
		return nil, err
	}
	reapOrphans()

	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b := &Bouncer{
		dir:     dir,
		user:    up.User,
		db:      up.Database,
		version: version,
		logFile: filepath.Join(dir, "pgbouncer.log"),
	}
	ok := false
	defer func() {
		if !ok {
			_ = b.Stop()
		}
	}()
	if err := run.prepareDir(dir); err != nil {
		return nil, err
	}
	if err := run.writeFile(filepath.Join(dir, "userlist.txt"), userlist(up.User)); err != nil {
		return nil, err
	}

	const attempts = 5
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: pick a free port: %w", err)
		}
		b.port = port
		ini := iniFile(dir, port, mode, opts.PoolSize, up, opts.Settings)
		if err := run.writeFile(filepath.Join(dir, "pgbouncer.ini"), ini); err != nil {
			return nil, err
		}
		_ = os.Remove(b.logFile) // one log per attempt, so the clash check reads this one
		if err := b.launch(bin, run); err != nil {
			return nil, err
		}
		err = b.waitReady(ctx)
		if err == nil {
			ok = true
			return b, nil
		}
		clash := strings.Contains(b.logTail(), "in use")
		b.kill()
		if attempt < attempts && clash && ctx.Err() == nil {
			b.exited, b.cmd, b.stderr = nil, nil, nil
			continue
		}
		return nil, fmt.Errorf("%w\npgbouncer log (%s, last lines):\n%s", err, b.logFile, b.logTail())
	}
}

// DSN returns a connection string for the upstream database and user through the
// bouncer, on 127.0.0.1 without TLS. Any database name can be used through it.
func (b *Bouncer) DSN() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(b.user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path:     "/" + b.db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the bouncer's TCP port on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Version returns the first line of `pgbouncer --version`, e.g. "PgBouncer 1.18.0".
func (b *Bouncer) Version() string { return b.version }

// Log returns PgBouncer's log so far (its logfile, or what it wrote to stderr before it
// opened the logfile).
func (b *Bouncer) Log() string {
	if data, err := os.ReadFile(b.logFile); err == nil && len(data) > 0 {
		return string(data)
	}
	if b.stderr != nil {
		return b.stderr.String()
	}
	return ""
}

// Stop kills PgBouncer (SIGTERM, then SIGKILL if it lingers), waits for it to exit and
// removes its directory. Clients connected through it see their connections closed; the
// server connections it held are closed too, which ends their sessions and every lock in
// them. Stop is idempotent: later calls return the first call's result.
func (b *Bouncer) Stop() error {
	b.stopOnce.Do(func() {
		b.kill()
		b.stopErr = os.RemoveAll(b.dir)
		if b.stopErr != nil {
			b.stopErr = fmt.Errorf("pgbouncer: remove %s: %w", b.dir, b.stopErr)
		}
	})
	return b.stopErr
}

// launch starts the process; a goroutine owned by b reaps it (b.exited closes then).
func (b *Bouncer) launch(bin string, run *runAs) error {
	cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	b.stderr = &tailBuffer{}
	cmd.Stdout = b.stderr
	cmd.Stderr = b.stderr
	cmd.SysProcAttr = run.sysProcAttr()
	// Closing our pipes must not wait on a grandchild; pgbouncer has none, but be safe.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgbouncer: start %s: %w", bin, err)
	}
	b.cmd = cmd
	exited := make(chan struct{})
	b.exited = exited
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	return nil
}

// kill ends the current process, if any, and waits for it to be reaped.
func (b *Bouncer) kill() {
	if b.cmd == nil || b.exited == nil {
		return
	}
	// PgBouncer <= 1.22: SIGTERM is an immediate shutdown. Later versions wait for
	// clients on SIGTERM, so SIGKILL follows after a short grace.
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
		return
	case <-time.After(2 * time.Second):
	}
	_ = b.cmd.Process.Kill()
	<-b.exited // SIGKILL cannot be ignored; Wait returns
}

// waitReady polls until a client connects through the bouncer and runs a query, the
// process exits, or ctx ends.
func (b *Bouncer) waitReady(ctx context.Context) error {
	var last error
	for {
		select {
		case <-b.exited:
			return fmt.Errorf("%w before accepting connections (%s)", errExited, b.cmd.ProcessState)
		default:
		}
		err := b.probe(ctx)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// PgBouncer answered with an error: it is up, but cannot serve (the
			// upstream refused the login, or the configuration is wrong).
			return fmt.Errorf("pgbouncer: listening on port %d, but a query through it failed: %w", b.port, err)
		}
		last = err
		if log := b.Log(); strings.Contains(log, "connect failed") || strings.Contains(log, "login failed") {
			// PgBouncer is up but cannot reach or log in to the upstream server; it
			// would keep clients waiting (query_wait_timeout) and retry forever.
			return fmt.Errorf("pgbouncer: listening on port %d, but it cannot connect to the upstream server", b.port)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgbouncer: not accepting connections on port %d: %w (last attempt: %v)", b.port, ctx.Err(), last)
		case <-b.exited:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe connects through the bouncer and runs one query (simple protocol, which every
// pool mode accepts).
func (b *Bouncer) probe(ctx context.Context) error {
	// Short: a bouncer that cannot reach the upstream server keeps the client waiting;
	// the caller looks at the log between attempts.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgconn.Connect(pctx, b.DSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(pctx))
	_, err = conn.Exec(pctx, "SELECT 1").ReadAll()
	return err
}

// logTail returns the last few KiB of the log.
func (b *Bouncer) logTail() string {
	s := b.Log()
	const max = 4 << 10
	if len(s) > max {
		s = s[len(s)-max:]
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.TrimSpace(s)
}

// iniFile renders pgbouncer.ini.
func iniFile(dir string, port int, mode string, poolSize int, up *pgconn.Config, extra map[string]string) []byte {
	if poolSize <= 0 {
		poolSize = 20
	}
	var b strings.Builder
	b.WriteString("; Written by internal/pgbouncer: a throwaway PgBouncer for tests.\n[databases]\n")
	// One wildcard entry: any database name a client asks for, on the upstream server,
	// logged in as the upstream user.
	conn := []string{"host=" + connValue(up.Host), "port=" + strconv.Itoa(int(up.Port)), "user=" + connValue(up.User)}
	if up.Password != "" {
		conn = append(conn, "password="+connValue(up.Password))
	}
	fmt.Fprintf(&b, "* = %s\n\n[pgbouncer]\n", strings.Join(conn, " "))
	kv := func(name, value string) { fmt.Fprintf(&b, "%s = %s\n", name, value) }
	kv("listen_addr", "127.0.0.1")
	kv("listen_port", strconv.Itoa(port))
	kv("unix_socket_dir", "") // no unix socket: nothing to clean up, no path limits
	kv("auth_type", "trust")
	kv("auth_file", filepath.Join(dir, "userlist.txt"))
	kv("admin_users", up.User)
	kv("pool_mode", mode)
	kv("default_pool_size", strconv.Itoa(poolSize))
	kv("max_client_conn", "500")
	kv("ignore_startup_parameters", "extra_float_digits")
	kv("server_login_retry", "1")
	kv("logfile", filepath.Join(dir, "pgbouncer.log"))
	kv("pidfile", filepath.Join(dir, "pgbouncer.pid"))
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

// connValue quotes a value of a [databases] connection string, libpq style.
func connValue(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	return "'" + strings.ReplaceAll(v, "'", `\'`) + "'"
}

// userlist renders the auth_file: auth_type=trust still requires the user to be listed.
func userlist(user string) []byte {
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	return []byte(q(user) + " " + q("") + "\n")
}

// freePort returns a TCP port free on 127.0.0.1 at the time of the call.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// tailBuffer keeps the last 64 KiB written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 64<<10; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
