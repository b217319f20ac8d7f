package services

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvDatabaseURL names the variable holding a connection string to use
// instead of a throwaway cluster.
const EnvDatabaseURL = "DATABASE_URL"

// Postgres is the database of a run.
type Postgres struct {
	DSN       string
	Throwaway bool   // started by us
	BinDir    string // throwaway only
	dir       string
	cred      *syscall.Credential
}

// Settings of the throwaway cluster, reported in the results.
var ThrowawaySettings = []string{
	"fsync=off", "synchronous_commit=off", "full_page_writes=off",
	"max_connections=300", "shared_buffers=128MB",
}

// StartPostgres returns DATABASE_URL's database, or starts a throwaway
// cluster (about 1-2 s). Stop the result with Stop.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	if url := os.Getenv(EnvDatabaseURL); url != "" {
		return &Postgres{DSN: url}, nil
	}
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := unprivileged("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgxlockbench-pg-*")
	if err != nil {
		return nil, err
	}
	p := &Postgres{Throwaway: true, BinDir: bin, dir: dir, cred: cred}
	ok := false
	defer func() {
		if !ok {
			p.Stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
		// The parent (the temp dir) must be traversable by that user.
		_ = os.Chmod(dir, 0o700)
	}
	data := filepath.Join(dir, "data")
	if err := run(ctx, cred, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(port),
		"unix_socket_directories = '" + dir + "'",
		"logging_collector = off",
		"log_min_messages = warning",
	}
	for _, s := range ThrowawaySettings {
		name, value, _ := strings.Cut(s, "=")
		conf = append(conf, name+" = '"+value+"'")
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString("\n# pgxlockbench\n" + strings.Join(conf, "\n") + "\n")
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, err
	}
	if err := run(ctx, cred, filepath.Join(bin, "pg_ctl"), "start", "-D", data,
		"-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "-s"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("%w\nserver log:\n%s", err, log)
	}
	p.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	ok = true
	return p, nil
}

// Stop stops and deletes a throwaway cluster; it does nothing for
// DATABASE_URL. It is idempotent.
func (p *Postgres) Stop() {
	if p == nil || p.dir == "" {
		return
	}
	data := filepath.Join(p.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		_ = run(ctx, p.cred, filepath.Join(p.BinDir, "pg_ctl"), "stop", "-D", data, "-m", "immediate", "-w", "-s")
		cancel()
	}
	_ = os.RemoveAll(p.dir)
	p.dir = ""
}

// findBinDir finds initdb and pg_ctl: pg_config --bindir, the newest
// /usr/lib/postgresql/<version>/bin, then PATH.
func findBinDir() (string, error) {
	has := func(dir string) bool {
		for _, n := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if d := filepath.Dir(p); has(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no database: set %s, or install the PostgreSQL server binaries (apt-get install postgresql) so a throwaway cluster can be started", EnvDatabaseURL)
}
