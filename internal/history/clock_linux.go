//go:build linux

package history

import (
	"syscall"
	"unsafe"
)

// clockMonotonic is CLOCK_MONOTONIC from <time.h>.
const clockMonotonic = 1

// Now returns the current time in nanoseconds of CLOCK_MONOTONIC. The clock is the
// same for every process on the machine, so readings taken in different processes
// compare directly. (Go's time.Now carries a monotonic reading too, but relative to the
// process's start, so it cannot order events of two processes.)
func Now() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic("history: clock_gettime(CLOCK_MONOTONIC): " + errno.Error())
	}
	return ts.Nano()
}
