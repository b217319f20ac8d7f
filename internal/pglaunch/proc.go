package pglaunch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ownerFile, in a cluster's temporary directory, holds the PID of the process that
// started the cluster; reapOrphans stops clusters whose owner is gone.
const ownerFile = "owner.pid"

// dirPrefix names cluster directories in the temporary directory.
const dirPrefix = "pglaunch-"

// maxSocketDir keeps "<dir>/.s.PGSQL.<port>" under the unix socket path limit (104 bytes
// on macOS, 108 on Linux).
const maxSocketDir = 100 - len("/.s.PGSQL.65535")

// clusterBases are the directories cluster directories go in, preferred first.
func clusterBases() []string {
	if b := os.TempDir(); b != "/tmp" {
		return []string{b, "/tmp"}
	}
	return []string{"/tmp"}
}

// makeClusterDir creates the cluster's temporary directory, owned by the PostgreSQL OS
// user, in the first base directory that user can reach and whose path is short enough
// for a unix socket.
func makeClusterDir(r *runner) (string, error) {
	var reasons []string
	for _, base := range clusterBases() {
		if len(base)+len("/"+dirPrefix+"1234567890") > maxSocketDir {
			reasons = append(reasons, base+": path too long for a unix socket")
			continue
		}
		if !traversable(base, r.uid, r.gid) {
			reasons = append(reasons, fmt.Sprintf("%s: not traversable by uid %d", base, r.uid))
			continue
		}
		dir, err := os.MkdirTemp(base, dirPrefix)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		err = errors.Join(
			os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644),
			r.chown(dir),
			os.Chmod(dir, 0o700),
		)
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("pglaunch: prepare %s: %w", dir, err)
		}
		return dir, nil
	}
	return "", fmt.Errorf("pglaunch: no usable temporary directory: %s", strings.Join(reasons, "; "))
}

// reapOrphans stops and removes clusters left by processes that died without Stop (a test
// binary killed by -timeout, a crash). Best effort; a directory without an owner file may
// be one being created and is left alone.
func reapOrphans(r *runner) {
	for _, base := range clusterBases() {
		dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
		for _, dir := range dirs {
			b, err := os.ReadFile(filepath.Join(dir, ownerFile))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 || processAlive(pid) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			orphan := &Cluster{dir: dir, dataDir: filepath.Join(dir, "data"), logFile: filepath.Join(dir, "server.log"), r: r}
			if bin, ok := postmasterBinDir(orphan.dataDir); ok {
				orphan.binDir = bin
			}
			err = orphan.Stop(ctx)
			cancel()
			r.logf("reaped cluster %s left by dead process %d (err: %v)", dir, pid, err)
		}
	}
}

// postmasterBinDir finds the bin directory of the postgres binary of a running postmaster
// of dataDir, for pg_ctl. ok is false when none runs or it cannot be told.
func postmasterBinDir(dataDir string) (string, bool) {
	pid, ok := postmasterPID(dataDir)
	if !ok || runtime.GOOS != "linux" {
		return "", false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", false
	}
	return filepath.Dir(exe), true
}

// processAlive reports whether a process with this PID exists (EPERM: it does, someone
// else's). On Linux a zombie (exited, not yet reaped by its parent, which for a postmaster
// is init) counts as gone.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if runtime.GOOS == "linux" {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return !errors.Is(err, os.ErrNotExist)
		}
		// pid (comm) state ...: comm may hold spaces and parentheses, so use the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return false
		}
	}
	return true
}

// waitGone waits up to d for a process to exit; it reports whether it did.
func waitGone(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if !processAlive(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// postmasterPID returns the PID in dataDir/postmaster.pid when that process is alive and,
// on Linux, really runs in dataDir (a stale file's PID may belong to someone else now).
func postmasterPID(dataDir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 || !processAlive(pid) {
		return 0, false
	}
	if runtime.GOOS == "linux" {
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil {
			return 0, false
		}
		want, err := filepath.EvalSymlinks(dataDir)
		if err != nil || cwd != want {
			return 0, false
		}
	}
	return pid, true
}

// killPostmaster shuts a postmaster down without pg_ctl: SIGQUIT (immediate shutdown, the
// postmaster takes its children down), then SIGKILL if it lingers.
func killPostmaster(pid int, dataDir string) error {
	for _, sig := range []syscall.Signal{syscall.SIGQUIT, syscall.SIGKILL} {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pglaunch: signal postmaster %d: %w", pid, err)
		}
		if waitGone(pid, 5*time.Second) {
			return nil
		}
	}
	return fmt.Errorf("pglaunch: postmaster %d of %s did not exit", pid, dataDir)
}
