// Package extest helps the examples' tests: a fresh database per test, the example's
// binary built once, and child processes whose output lines can be awaited.
//
// Every test binary that uses it runs pgtest.Main from TestMain.
package extest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// DatabaseURL creates an empty database on the test server and returns its URL; it is
// dropped at cleanup. The examples use fixed table names and advisory keys, and advisory
// locks are per database, so a database per test isolates both.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	admin := pgtest.DSN(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "ex_" + hex.EncodeToString(b[:])

	run := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := run("CREATE DATABASE " + name); err != nil {
		t.Fatalf("extest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		// FORCE: a child process killed on purpose may leave a session behind for a moment.
		if err := run("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("extest: drop database %s: %v", name, err)
		}
	})
	return withDatabase(t, admin, name)
}

// withDatabase returns dsn pointing at database name, for URL and keyword/value DSNs.
func withDatabase(t testing.TB, dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("extest: parse test DSN: %v", err)
		}
		u.Path = "/" + name
		return u.String()
	}
	return dsn + " dbname=" + name // a later keyword wins
}

// Connect opens a connection to dsn for checking results; it is closed at cleanup.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("extest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

var builds sync.Map // package dir -> *build

type build struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the main package in the current directory (the test's package) once per
// test binary and returns the executable's path.
func Build(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := builds.LoadOrStore(wd, &build{})
	b := v.(*build)
	b.once.Do(func() {
		// Not t.TempDir: the binary outlives the first test that asks for it.
		dir, err := os.MkdirTemp("", "pgxlock-example-")
		if err != nil {
			b.err = err
			return
		}
		// Removed when the test binary's tests are over (pgtest.Main).
		pgtest.AtExit(func() { _ = os.RemoveAll(dir) })
		b.path = filepath.Join(dir, filepath.Base(wd))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", b.path, ".").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("extest: %v", b.err)
	}
	return b.path
}

// Proc is a running child process whose combined output is collected line by line.
type Proc struct {
	Name string
	Cmd  *exec.Cmd

	mu    sync.Mutex
	lines []string
	grew  chan struct{} // closed and replaced whenever a line arrives or output ends
	eof   bool

	waitErr error
	done    chan struct{} // closed when the process has exited and output is drained
}

// Start runs bin with args and the environment env added to the test's, and kills it at
// cleanup if it is still running. Its output is logged to the test as it arrives.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	p := &Proc{Name: name, Cmd: cmd, grew: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("extest: start %s: %v", name, err)
	}
	var scanned sync.WaitGroup
	scanned.Add(1)
	go func() {
		defer scanned.Done()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			t.Logf("[%s] %s", name, sc.Text())
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.grew)
			p.grew = make(chan struct{})
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		pw.Close()
		scanned.Wait()
		p.mu.Lock()
		p.eof = true
		close(p.grew)
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // no-op error if it already exited
		<-p.done
	})
	return p
}

// Lines returns a copy of the output lines so far.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// WaitLine waits up to timeout for an output line, from index from on, containing substr,
// and returns its index. It fails the test if none comes.
func (p *Proc) WaitLine(t testing.TB, from int, substr string, timeout time.Duration) int {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for i := from; i < len(p.lines); i++ {
			if strings.Contains(p.lines[i], substr) {
				p.mu.Unlock()
				return i
			}
		}
		from = max(from, len(p.lines))
		eof, grew := p.eof, p.grew
		p.mu.Unlock()
		if eof {
			t.Fatalf("extest: %s exited without printing %q", p.Name, substr)
		}
		select {
		case <-grew:
		case <-deadline.C:
			t.Fatalf("extest: %s printed no %q within %v", p.Name, substr, timeout)
		}
	}
}

// WaitAny waits up to timeout for a line containing substr in the output of any of procs,
// looking in procs[i] from line from[i] on (from may be nil: from the start). It returns
// which process printed it and the line's index, and fails the test if none does.
func WaitAny(t testing.TB, procs []*Proc, from []int, substr string, timeout time.Duration) (proc, line int) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)}}
		for i, p := range procs {
			start := 0
			if from != nil {
				start = from[i]
			}
			p.mu.Lock()
			for j := start; j < len(p.lines); j++ {
				if strings.Contains(p.lines[j], substr) {
					p.mu.Unlock()
					return i, j
				}
			}
			if !p.eof {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.grew)})
			}
			p.mu.Unlock()
		}
		if len(cases) == 1 {
			t.Fatalf("extest: every process exited without printing %q", substr)
		}
		if chosen, _, _ := reflect.Select(cases); chosen == 0 {
			t.Fatalf("extest: no process printed %q within %v", substr, timeout)
		}
	}
}

// Wait waits up to timeout for the process to exit and returns its exit code. It fails
// the test (after killing the process) if it does not exit in time.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Fatalf("extest: %s did not exit within %v", p.Name, timeout)
	}
	return p.Cmd.ProcessState.ExitCode()
}
