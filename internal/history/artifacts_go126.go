//go:build go1.26

package history

import (
	"flag"
	"testing"
)

// outputDir is the test's artifact directory under -artifacts; else a kept temporary
// directory (without the flag, ArtifactDir's directory is removed after the test).
func outputDir(t testing.TB) (string, error) {
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		if a, ok := t.(interface{ ArtifactDir() string }); ok {
			return a.ArtifactDir(), nil
		}
	}
	return keptDir()
}
