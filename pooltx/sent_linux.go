//go:build linux

package pooltx

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// meter reads, for one TCP socket, the kernel's counts of bytes written
// by the application and of bytes received, and whether the connection is
// still established both ways.
type meter struct {
	raw  syscall.RawConn // nil: cannot be read
	read func(fd uintptr)
	info unix.TCPInfo
	n    traffic
	ok   bool

	peek  func(fd uintptr)
	buf   [1]byte
	empty bool // the last peek found nothing to read and no end of stream
	ended bool // the last peek found the end of stream: the read side is over
}

// newMeter returns a meter for nc, or nil when nc is not a TCP socket
// (after unwrapping NetConn methods: *tls.Conn has one).
func newMeter(nc net.Conn) *meter {
	tc := tcpConn(nc)
	if tc == nil {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	m := &meter{raw: raw}
	m.read = m.readFD
	m.peek = m.peekFD
	return m
}

func tcpConn(nc net.Conn) *net.TCPConn {
	for range 8 {
		switch c := nc.(type) {
		case *net.TCPConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// tcpiSentEnd is how much of struct tcp_info a kernel must fill for
// tcpi_bytes_sent (Linux 4.19) to be read; tcpi_bytes_received (4.1) and
// tcpi_notsent_bytes (4.6) come before it.
const tcpiSentEnd = unsafe.Offsetof(unix.TCPInfo{}.Bytes_sent) + unsafe.Sizeof(unix.TCPInfo{}.Bytes_sent)

// tcpEstablished is TCP_ESTABLISHED of the kernel's tcp_states.h: neither
// side has shut down. A write side shut down (FIN_WAIT1/2) or a peer that
// closed its side (CLOSE_WAIT: the server ended the session) is another.
const tcpEstablished = 1

// readFD reads TCP_INFO; getsockopt does not block, so the raw syscall
// (no scheduler hand-off) serves.
func (m *meter) readFD(fd uintptr) {
	l := uint32(unix.SizeofTCPInfo)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&m.info)), uintptr(unsafe.Pointer(&l)), 0)
	// A socket pgx has used has sent its startup message: a kernel that
	// fills the field but leaves it 0 (a sandbox's partial TCP_INFO) is
	// not counting, and the reset must run.
	m.ok = e == 0 && uintptr(l) >= tcpiSentEnd && m.info.Bytes_sent > 0
	m.n = traffic{
		written:     m.info.Bytes_sent + uint64(m.info.Notsent_bytes),
		received:    m.info.Bytes_received,
		established: m.info.State == tcpEstablished,
	}
}

// traffic reads the socket's counts (written: sent, retransmissions
// included, plus queued and not yet sent; received), and whether they
// could be read.
func (m *meter) traffic() (traffic, bool) {
	if m.raw == nil {
		return traffic{}, false
	}
	if err := m.raw.Control(m.read); err != nil {
		return traffic{}, false
	}
	return m.n, m.ok
}

// peekFD asks, without waiting and without taking anything, whether the
// socket has a byte to read or its read side has ended (a FIN received, or
// shutdown(SHUT_RD), which leaves the TCP state ESTABLISHED): only EAGAIN
// means neither.
func (m *meter) peekFD(fd uintptr) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&m.buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	m.empty = e == unix.EAGAIN
	m.ended = e == 0 && n == 0
}

// nothingToRead reports whether the socket has nothing to read and its
// read side is open (false where that cannot be told).
func (m *meter) nothingToRead() bool {
	if m.raw == nil {
		return false
	}
	if err := m.raw.Control(m.peek); err != nil {
		return false
	}
	return m.empty
}

// readEnded reports whether the peek of the last nothingToRead found the
// end of stream (a FIN received with nothing before it, or the read side
// shut down): nothing more can be read from the socket, or, after
// shutdown(SHUT_RD), only what happens to arrive before a read asks.
func (m *meter) readEnded() bool { return m.ended }
