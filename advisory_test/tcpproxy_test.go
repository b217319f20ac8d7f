package advisory_test

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
)

// tcpProxy forwards connections to the test database and can cut them silently (see
// package tcpproxy, which the soak command shares).
type tcpProxy = tcpproxy.Proxy

// newTCPProxy listens on 127.0.0.1 and forwards to network/target; the test's cleanup
// closes it.
func newTCPProxy(t testing.TB, network, target string) *tcpProxy {
	t.Helper()
	p, err := tcpproxy.New(network, target)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// proxiedPoolConfig returns pgtest.Config(t) (a unique application_name) with the
// connection going through a new tcpProxy in front of the test database.
func proxiedPoolConfig(t testing.TB) (*pgxpool.Config, *tcpProxy) {
	t.Helper()
	cfg := pgtest.Config(t)
	cc := cfg.ConnConfig
	network, target := "tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	if strings.HasPrefix(cc.Host, "/") {
		network, target = "unix", filepath.Join(cc.Host, ".s.PGSQL."+strconv.Itoa(int(cc.Port)))
	}
	p := newTCPProxy(t, network, target)
	cc.Host, cc.Port, cc.Fallbacks = "127.0.0.1", uint16(p.Port()), nil
	return cfg, p
}
