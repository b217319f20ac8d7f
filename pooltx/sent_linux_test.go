//go:build linux

package pooltx

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair returns the two ends of a loopback TCP connection; the server end
// is never read unless the test reads it.
func tcpPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// The meter counts every byte the application wrote, whether the kernel
// has sent it or still queues it (a peer that stopped reading: the frozen
// network of the fault tests), so that code that wrote anything is never
// taken for code that wrote nothing.
func TestMeterCountsBytesSentAndQueued(t *testing.T) {
	client, _ := tcpPair(t)
	m := newMeter(client)
	require.NotNil(t, m)
	_, ok := m.traffic()
	require.False(t, ok, "a socket that has sent nothing does not count as measured")
	_, err := client.Write([]byte{0})
	require.NoError(t, err)
	t0, ok := m.traffic()
	n0 := t0.written
	require.True(t, t0.established)
	require.True(t, ok, "TCP_INFO's tcpi_bytes_sent readable (Linux 4.19 or later)")

	_, err = client.Write(make([]byte, 100))
	require.NoError(t, err)
	t1, ok := m.traffic()
	n1 := t1.written
	require.True(t, ok)
	assert.Equal(t, n0+100, n1)

	// Fill the peer's receive buffer and our send buffer: the peer never
	// reads, so most of what is written stays queued, unsent.
	written := 0
	chunk := make([]byte, 64<<10)
	require.NoError(t, client.SetWriteDeadline(time.Now().Add(300*time.Millisecond)))
	for {
		n, err := client.Write(chunk)
		written += n
		if err != nil {
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "a full send buffer, not %v", err)
			break
		}
	}
	require.Greater(t, written, 64<<10)
	t2, ok := m.traffic()
	n2 := t2.written
	require.True(t, ok)
	assert.Equal(t, n1+uint64(written), n2, "queued bytes count as written")
}

// The meter finds the TCP socket under crypto/tls's Conn (and any wrapper
// with a NetConn method); a Unix-domain socket has none to read, and the
// reset then always runs.
func TestMeterUnwrapsTLSAndRefusesUnixSockets(t *testing.T) {
	client, _ := tcpPair(t)
	tc := tls.Client(client, &tls.Config{InsecureSkipVerify: true})
	m := newMeter(tc)
	require.NotNil(t, m, "found the TCP socket under TLS")
	_, err := client.Write([]byte{0})
	require.NoError(t, err)
	_, ok := m.traffic()
	assert.True(t, ok)

	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	uc, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer uc.Close()
	assert.Nil(t, newMeter(uc), "a Unix-domain socket: unmeasured")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Nil(t, newMeter(a), "no socket at all: unmeasured")
	_ = os.Remove(path)
}

// BenchmarkMeter is what the quiet check of a lent connection costs on
// this machine's kernel: one TCP_INFO read (traffic: Lend takes one,
// Reclaim another) and one peek (nothingToRead, Reclaim's). BENCHMARKS.md
// quotes it.
func BenchmarkMeter(b *testing.B) {
	client, _ := tcpPair(b)
	_, err := client.Write([]byte{0}) // a socket that sent nothing is not counting (readFD)
	require.NoError(b, err)
	m := newMeter(client)
	require.NotNil(b, m)
	b.Run("op=traffic", func(b *testing.B) {
		for b.Loop() {
			if _, ok := m.traffic(); !ok {
				b.Fatal("TCP_INFO could not be read")
			}
		}
	})
	b.Run("op=nothingToRead", func(b *testing.B) {
		for b.Loop() {
			if !m.nothingToRead() {
				b.Fatal("the peek found something to read")
			}
		}
	})
}
