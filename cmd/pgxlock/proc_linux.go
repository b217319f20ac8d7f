package main

import "syscall"

// sysProcAttr puts the command in a process group of its own (unless
// foreground), so that forwarded signals and the lost-lock SIGTERM/SIGKILL
// reach its children too, and asks the kernel to SIGKILL it if pgxlock dies
// first (kill -9, OOM): the session, and so the lock, dies with pgxlock, and
// the command must not go on without it. Pdeathsig reaches the command
// itself, not its children.
func sysProcAttr(foreground bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: !foreground, Pdeathsig: syscall.SIGKILL}
}
