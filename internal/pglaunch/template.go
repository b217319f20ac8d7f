package pglaunch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// templateVersion changes whenever the initdb arguments change, so old entries are ignored.
const templateVersion = "pglaunch-template-v1"

// initdbArgs are the arguments after -D <dir>. Part of the cache key through
// templateVersion: change both together.
var initdbArgs = []string{"-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"}

// templateCache is one cache entry: a pristine data directory made by initdb with
// initdbArgs by the binaries in one bin directory. Entries appear by atomic rename, so an
// entry that exists is complete.
type templateCache struct {
	dir   string // cache directory
	entry string // dir/<key>
	log   func(format string, args ...any)
}

// newTemplateCache returns the cache entry for binDir, or nil when the cache is off or
// unusable (no cache directory, binaries not stat-able).
func newTemplateCache(opts Options, binDir string) *templateCache {
	if opts.NoTemplateCache {
		return nil
	}
	dir := opts.CacheDir
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return nil
		}
		dir = filepath.Join(base, "pglaunch")
	}
	// The key changes when the binaries change (upgrade, another version).
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%q\n", templateVersion, binDir, initdbArgs)
	for _, name := range []string{"initdb", "postgres"} {
		st, err := os.Stat(filepath.Join(binDir, name))
		if err != nil {
			return nil
		}
		fmt.Fprintf(h, "%s %d %d\n", name, st.Size(), st.ModTime().UnixNano())
	}
	tc := &templateCache{dir: dir, entry: filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16])}
	tc.log = func(string, ...any) {}
	if opts.Log != nil {
		tc.log = func(format string, args ...any) { fmt.Fprintf(opts.Log, "pglaunch: "+format+"\n", args...) }
	}
	return tc
}

// prepareData fills c.dataDir: a copy of the cached template when there is one, else
// initdb (then the result is offered to the cache). tc may be nil.
func (c *Cluster) prepareData(ctx context.Context, tc *templateCache) (fromTemplate bool, err error) {
	if tc != nil {
		if _, err := os.Stat(filepath.Join(tc.entry, "PG_VERSION")); err == nil {
			err := copyTree(tc.entry, c.dataDir, c.r.chown, false)
			if err == nil {
				return true, nil
			}
			tc.log("copy of cached template %s failed, running initdb: %v", tc.entry, err)
			if err := os.RemoveAll(c.dataDir); err != nil {
				return false, fmt.Errorf("pglaunch: %w", err)
			}
		}
	}
	args := append([]string{"-D", c.dataDir}, initdbArgs...)
	if _, err := c.r.run(ctx, c.bin("initdb"), args...); err != nil {
		return false, err
	}
	if tc != nil {
		if err := tc.populate(c.dataDir); err != nil {
			tc.log("could not cache template data directory: %v", err)
		}
	}
	return false, nil
}

// populate copies a data directory fresh from initdb (never started) into the cache,
// synced to disk, and publishes it by rename. Losing a race to another process is fine.
func (tc *templateCache) populate(dataDir string) error {
	if err := os.MkdirAll(tc.dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(tc.dir, "tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	t0 := time.Now()
	staged := filepath.Join(tmp, "data")
	if err := copyTree(dataDir, staged, nil, true); err != nil {
		return err
	}
	if err := os.Rename(staged, tc.entry); err != nil {
		if _, statErr := os.Stat(filepath.Join(tc.entry, "PG_VERSION")); statErr == nil {
			return nil // another process published the same template first
		}
		return err
	}
	tc.log("cached template data directory in %s (%v)", tc.entry, time.Since(t0).Round(time.Millisecond))
	return nil
}

// invalidate removes the cache entry (renamed away first, so no one copies a half-removed
// directory).
func (tc *templateCache) invalidate() {
	tmp, err := os.MkdirTemp(tc.dir, "tmp-")
	if err != nil {
		return
	}
	defer os.RemoveAll(tmp)
	_ = os.Rename(tc.entry, filepath.Join(tmp, "old"))
}

// copyTree copies a data directory: directories and regular files only, permissions kept,
// each created path passed to chown (may be nil). With sync, files are fsynced.
func copyTree(src, dst string, chown func(string) error, sync bool) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, sync); err != nil {
				return err
			}
		default:
			return fmt.Errorf("pglaunch: unexpected file type %v at %s", d.Type(), path)
		}
		if err := os.Chmod(target, info.Mode().Perm()); err != nil {
			return err
		}
		if chown != nil {
			return chown(target)
		}
		return nil
	})
}

func copyFile(src, dst string, sync bool) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if sync {
		return out.Sync()
	}
	return nil
}
