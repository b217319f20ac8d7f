//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts the command in a process group of its own (unless
// foreground), so that forwarded signals and the lost-lock SIGTERM/SIGKILL
// reach its children too. This platform has no parent-death signal: if
// pgxlock is killed with SIGKILL the command goes on without the lock.
func sysProcAttr(foreground bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: !foreground}
}
