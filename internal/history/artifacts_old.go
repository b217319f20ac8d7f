//go:build !go1.26

package history

import "testing"

// outputDir is a kept temporary directory: Go before 1.26 has no artifact directory.
func outputDir(testing.TB) (string, error) { return keptDir() }
