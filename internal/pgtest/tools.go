package pgtest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// EnvStrict names the environment variable that turns a skip for a missing tool (see
// [MissingTool]) into a failure. CI sets it (.ci/run), so that a CI machine without
// PgBouncer fails instead of passing with tests skipped.
const EnvStrict = "PGXLOCK_TEST_STRICT"

// SetupCommand is the one command that installs what the tests and examples need on
// Debian or Ubuntu (PostgreSQL's server binaries and PgBouncer, through apt-get, with
// sudo unless run as root): "bash <repository>/.ci/setup", with the repository's path
// as this package was compiled from, or ".ci/setup" from the repository root when that
// path is unknown (a -trimpath build).
func SetupCommand() string {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		setup := filepath.Join(filepath.Dir(file), "..", "..", ".ci", "setup")
		if _, err := os.Stat(setup); err == nil {
			return "bash " + setup
		}
	}
	return "bash .ci/setup (from the repository root)"
}

// strict reports whether EnvStrict is set to a true value.
func strict() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(EnvStrict))) {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// MissingTool ends a test that needs a tool the machine does not have (PgBouncer, for
// the proxy tests): it skips the test with a message that names the tool, why it was
// not found (err) and the command that installs it ([SetupCommand]); with
// PGXLOCK_TEST_STRICT=1 in the environment it fails the test with the same message
// instead. It never returns.
//
// PostgreSQL itself is not such a tool: a test that needs a database and finds none
// fails (see the package documentation).
func MissingTool(t testing.TB, tool string, err error) {
	t.Helper()
	msg := tool + " is not installed, so this test cannot run: " + err.Error() +
		"\n  install it (Debian, Ubuntu): " + SetupCommand()
	if strict() {
		t.Fatalf("%s\n  (%s is set: a missing tool fails the test instead of skipping it)", msg, EnvStrict)
	}
	t.Skipf("%s\n  (set %s=1 to make this a failure, as CI does)", msg, EnvStrict)
}
