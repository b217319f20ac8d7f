package pglaunch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CommandError is returned when a PostgreSQL program (initdb, pg_ctl) fails. It carries the
// program's combined output and, for pg_ctl, the tail of the server log.
type CommandError struct {
	Args   []string // program and arguments
	Output string   // combined stdout and stderr, plus the server log tail when relevant
	Err    error    // the exec error (exit status, context error)
}

// Error includes the command line and its output, so a failed start explains itself.
func (e *CommandError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		out = "(no output)"
	}
	return fmt.Sprintf("pglaunch: %s: %v\n%s", strings.Join(e.Args, " "), e.Err, out)
}

// Unwrap returns the exec error.
func (e *CommandError) Unwrap() error { return e.Err }

// runner runs PostgreSQL programs as the right OS user with a clean environment.
type runner struct {
	cred *syscall.Credential // nil: run as the current user
	uid  int                 // owner for files we create (-1: leave as is)
	gid  int
	dir  string    // working directory for the programs
	log  io.Writer // optional progress output
}

// newRunner decides who runs PostgreSQL: the current user, or osUser when we are root.
func newRunner(osUser string, log io.Writer) (*runner, error) {
	r := &runner{uid: -1, gid: -1, log: log}
	if os.Geteuid() != 0 {
		return r, nil
	}
	if osUser == "" {
		osUser = "postgres"
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("pglaunch: running as root, and initdb refuses root; OS user %q to run PostgreSQL as: %w (create it, e.g. `useradd --system postgres`, or set Options.OSUser)", osUser, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pglaunch: OS user %q: %w", osUser, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("pglaunch: OS user %q is root; initdb refuses root, set Options.OSUser to an unprivileged user", osUser)
	}
	r.uid, r.gid = uid, gid
	r.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	return r, nil
}

// env is the parent's environment without PG* variables (PGDATA, PGPORT, PGOPTIONS... would
// change what initdb and pg_ctl do) and with the C locale, so messages are English and
// parseable.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// run runs a program and returns its combined output; a failure is a *CommandError.
func (r *runner) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = childEnv()
	cmd.Dir = r.dir
	if cmd.Dir == "" {
		cmd.Dir = "/" // the caller's working directory may be closed to the OS user
	}
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start leaves a server running; it redirects the server's output to the log
	// file, but should anything keep our pipe open, do not wait for it forever.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		return out.String(), &CommandError{Args: append([]string{filepath.Base(name)}, args...), Output: out.String(), Err: err}
	}
	return out.String(), nil
}

// chown gives path to the PostgreSQL OS user when we run as root; a no-op otherwise.
func (r *runner) chown(path string) error {
	if r.uid < 0 {
		return nil
	}
	return os.Lchown(path, r.uid, r.gid)
}

// writeFile writes a file owned by the PostgreSQL OS user.
func (r *runner) writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.WriteFile(path, data, perm); err != nil {
		return err
	}
	return r.chown(path)
}

// logf writes one progress line to the optional log.
func (r *runner) logf(format string, args ...any) {
	if r.log != nil {
		fmt.Fprintf(r.log, "pglaunch: "+format+"\n", args...)
	}
}

// traversable reports whether every directory from dir up to / can be entered by uid/gid
// (an approximation of access(2) for another user: other, group or owner execute bit).
func traversable(dir string, uid, gid int) bool {
	if uid < 0 {
		return true
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return false
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		mode := st.Mode().Perm()
		if !(mode&0o001 != 0 ||
			(int(sys.Uid) == uid && mode&0o100 != 0) ||
			(int(sys.Gid) == gid && mode&0o010 != 0)) {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}
