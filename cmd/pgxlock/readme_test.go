package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

// readmeSample returns the output lines README.md shows after the shell line
// "$ <command>; echo "exit $?"", up to the next "$ " line or the end of the block.
func readmeSample(t *testing.T, command string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if l != "$ "+command+`; echo "exit $?"` {
			continue
		}
		var out []string
		for _, o := range lines[i+1:] {
			if strings.HasPrefix(o, "$ ") || strings.HasPrefix(o, "```") {
				break
			}
			out = append(out, o)
		}
		return out
	}
	t.Fatalf("README.md has no sample for %q", command)
	return nil
}

var pidRE = regexp.MustCompile(`pid [0-9]+`)

// The README's sample of run --try on a busy key is what the binary prints,
// stderr line for line, with only the holder's pid differing: the hashed-key
// notice first, then the busy line naming the holder (another pgxlock run).
func TestReadmeRunTrySample(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Hash("nightly-report")
	holder := startCLI(t, "", nil, "run", "--key", "nightly-report", "--", "sleep", "100")
	waitCLI(t, pool, key, true)

	code, stdout, stderr := runCLI(t, nil, "run", "--key", "nightly-report", "--try", "--", "echo", "hi")
	got := strings.Split(stdout+stderr+"exit "+strconv.Itoa(code), "\n")
	want := readmeSample(t, "pgxlock run --key nightly-report --try -- echo hi")
	norm := func(ls []string) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = pidRE.ReplaceAllString(l, "pid N")
		}
		return out
	}
	assert.Equal(t, norm(want), norm(got))

	holder.signal(os.Interrupt)
	holder.wait()
	waitNoCLI(t, pool, key)
}
