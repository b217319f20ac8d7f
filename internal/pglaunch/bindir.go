package pglaunch

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
	"time"
)

// ErrNoBinaries is returned (wrapped) by [FindBinDir] when no PostgreSQL server binaries are
// installed where it looks.
var ErrNoBinaries = errors.New("pglaunch: no PostgreSQL server binaries (initdb) found")

// Globs searched by FindBinDir after pg_config, newest version first. Variables so that
// tests can point them elsewhere.
var (
	debianBinGlob = "/usr/lib/postgresql/*/bin"
	rhelBinGlob   = "/usr/pgsql-*/bin"
)

// FindBinDir returns a directory holding the PostgreSQL server binaries (initdb, pg_ctl,
// postgres). It tries, in order: `pg_config --bindir` when that directory holds initdb; the
// newest /usr/lib/postgresql/<version>/bin (Debian, Ubuntu); the directory of initdb on
// PATH; the newest /usr/pgsql-<version>/bin (RHEL, Fedora). When none qualifies the error
// wraps [ErrNoBinaries] and names every place it looked.
func FindBinDir() (string, error) {
	var looked []string

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if hasServerBinaries(dir) {
			return dir, nil
		}
		looked = append(looked, fmt.Sprintf("`pg_config --bindir` (%s: no initdb/pg_ctl/postgres there)", dir))
	} else {
		looked = append(looked, fmt.Sprintf("`pg_config --bindir` (%v)", err))
	}

	if dir, ok := newestVersionDir(debianBinGlob); ok {
		return dir, nil
	}
	looked = append(looked, debianBinGlob)

	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	looked = append(looked, "initdb on $PATH")

	if dir, ok := newestVersionDir(rhelBinGlob); ok {
		return dir, nil
	}
	looked = append(looked, rhelBinGlob)

	return "", fmt.Errorf("%w; looked in: %s", ErrNoBinaries, strings.Join(looked, ", "))
}

// hasServerBinaries reports whether dir holds the three programs Start runs.
func hasServerBinaries(dir string) bool {
	if dir == "" {
		return false
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// newestVersionDir expands a glob whose single * is a version ("15", "9.6", "16") and
// returns the match with the highest version that holds the server binaries.
func newestVersionDir(glob string) (string, bool) {
	matches, _ := filepath.Glob(glob)
	star := strings.Index(glob, "*")
	if star < 0 {
		return "", false
	}
	prefix, suffix := glob[:star], glob[star+1:]
	type cand struct {
		dir string
		ver []int
	}
	var cands []cand
	for _, m := range matches {
		v := strings.TrimSuffix(strings.TrimPrefix(m, prefix), suffix)
		cands = append(cands, cand{m, parseVersion(v)})
	}
	sort.Slice(cands, func(i, j int) bool { return versionLess(cands[j].ver, cands[i].ver) })
	for _, c := range cands {
		if hasServerBinaries(c.dir) {
			return c.dir, true
		}
	}
	return "", false
}

// parseVersion turns "9.6" into [9 6]; parts that are not numbers count as 0.
func parseVersion(s string) []int {
	var v []int
	for _, p := range strings.Split(s, ".") {
		n, _ := strconv.Atoi(p)
		v = append(v, n)
	}
	return v
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}
