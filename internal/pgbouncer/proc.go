package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// binDirs are searched, in order, when pgbouncer is not on PATH.
var binDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/usr/bin"}

// findBinary returns the pgbouncer executable: explicit, else on PATH, else in binDirs.
func findBinary(explicit string) (string, error) {
	if explicit != "" {
		p, err := exec.LookPath(explicit)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrNoBinary, explicit, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, d := range binDirs {
		p := filepath.Join(d, "pgbouncer")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w (looked on $PATH and in %s)", ErrNoBinary, strings.Join(binDirs, ", "))
}

// binaryVersion returns the first line of `pgbouncer --version`.
func binaryVersion(ctx context.Context, bin string) (string, error) {
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgbouncer: %s --version: %w\n%s", bin, err, out)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line), nil
}

// runAs decides who runs pgbouncer: the current user, or an unprivileged one when root.
type runAs struct {
	cred     *syscall.Credential // nil: the current user
	uid, gid int                 // owner for the files we create; -1 leaves them as they are
}

func newRunAs(osUser string) (*runAs, error) {
	r := &runAs{uid: -1, gid: -1}
	if os.Geteuid() != 0 {
		return r, nil
	}
	candidates := []string{osUser}
	if osUser == "" {
		candidates = []string{"postgres", "nobody"}
	}
	var errs []error
	for _, name := range candidates {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err := errors.Join(err1, err2); err != nil {
			errs = append(errs, fmt.Errorf("OS user %q: %w", name, err))
			continue
		}
		if uid == 0 {
			errs = append(errs, fmt.Errorf("OS user %q is root", name))
			continue
		}
		r.uid, r.gid = uid, gid
		r.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		return r, nil
	}
	return nil, fmt.Errorf("pgbouncer: running as root, and PgBouncer refuses root; no unprivileged OS user to run it as (create one, e.g. `useradd --system postgres`, or set Options.OSUser): %w", errors.Join(errs...))
}

func (r *runAs) sysProcAttr() *syscall.SysProcAttr {
	if r.cred == nil {
		return nil
	}
	return &syscall.SysProcAttr{Credential: r.cred}
}

// prepareDir writes the owner file and hands the directory to the OS user.
func (r *runAs) prepareDir(dir string) error {
	err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	if err == nil && r.uid >= 0 {
		err = os.Lchown(dir, r.uid, r.gid)
	}
	if err == nil {
		err = os.Chmod(dir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("pgbouncer: prepare %s: %w", dir, err)
	}
	return nil
}

// writeFile writes a file readable by the OS user (and nobody else).
func (r *runAs) writeFile(path string, data []byte) error {
	err := os.WriteFile(path, data, 0o600)
	if err == nil && r.uid >= 0 {
		err = os.Lchown(path, r.uid, r.gid)
	}
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

// reapOrphans kills the pgbouncer of directories whose owner process is gone (a test
// binary killed before Stop) and removes the directories. Best effort; a directory
// without an owner file may be one being created and is left alone.
func reapOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		owner, ok := readPID(filepath.Join(dir, ownerFile))
		if !ok || processAlive(owner) {
			continue
		}
		if pid, ok := readPID(filepath.Join(dir, "pgbouncer.pid")); ok && isPgbouncer(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = os.RemoveAll(dir)
	}
}

func readPID(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// processAlive reports whether a process with this PID exists (EPERM: someone else's).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// isPgbouncer reports whether pid runs pgbouncer; where that cannot be told (not Linux),
// it says no, so that a recycled PID is never killed.
func isPgbouncer(pid int) bool {
	if runtime.GOOS != "linux" {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "pgbouncer"
}
