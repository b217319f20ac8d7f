package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// cmdVersion prints the module version (or "(devel)" for a build from a
// checkout), the VCS revision when the build recorded one, and the Go version.
func cmdVersion(s stdio) int {
	version, revision, modified := "(unknown)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, kv := range bi.Settings {
			switch kv.Key {
			case "vcs.revision":
				revision = kv.Value
			case "vcs.modified":
				modified = kv.Value == "true"
			}
		}
	}
	line := "pgxlock " + version
	if revision != "" {
		line += " " + revision
		if modified {
			line += "+dirty"
		}
	}
	fmt.Fprintf(s.Out, "%s %s %s/%s\n", line, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}
