package pgtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAtExitHelperProcess is not a test of its own: TestAtExitRunsAfterTheTests runs
// it in a child test binary, where it registers a function that writes a file.
func TestAtExitHelperProcess(t *testing.T) {
	path := os.Getenv("PGTEST_ATEXIT_FILE")
	if path == "" {
		return // only meaningful as a child of TestAtExitRunsAfterTheTests
	}
	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, _ = f.WriteString(s)
			_ = f.Close()
		}
	}
	AtExit(func() { appendTo("registered first;") })
	AtExit(func() { appendTo("registered second;") })
	if _, err := os.Stat(path); err == nil {
		t.Fatal("AtExit ran before the tests finished")
	}
}

// What is registered with AtExit runs once the binary's tests are over (Main),
// in reverse order, and not before.
func TestAtExitRunsAfterTheTests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ran")
	cmd := exec.Command(os.Args[0], "-test.run=^TestAtExitHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_ATEXIT_FILE="+path)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := os.ReadFile(path)
	require.NoError(t, err, "the registered functions did not run: %s", out)
	require.Equal(t, "registered second;registered first;", string(got))
}
