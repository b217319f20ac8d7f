package advisory_test

import (
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/pooltx"
)

// proxied points cfg at a tcpproxy in front of its server and returns the proxy, closed
// at the test's end.
func proxied(t *testing.T, cfg *pgxpool.Config) *tcpproxy.Proxy {
	t.Helper()
	cc := cfg.ConnConfig
	network, target := "tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	if strings.HasPrefix(cc.Host, "/") {
		network, target = "unix", filepath.Join(cc.Host, ".s.PGSQL."+strconv.Itoa(int(cc.Port)))
	}
	proxy, err := tcpproxy.New(network, target)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	cc.Host, cc.Port, cc.Fallbacks = "127.0.0.1", uint16(proxy.Port()), nil
	cc.ConnectTimeout = 2 * time.Second
	return proxy
}

// The server runs a batch call's whole pipeline, COMMIT included, and the connection
// fails before the client reads a byte of the answer: the call cannot know whether it
// committed, so it returns pooltx.ErrCommitUnknown, and it never sends the batch again.
// In every exec mode (describe_exec prepares at each call, so the answer lost is the
// preparation's: nothing runs, and the call may say so). In the Exec and simple protocol
// modes pgx reports that failure as "conn closed", an error it marks safe to retry
// (pgconn.SafeToRetry), as if nothing had been sent: the call took it for a dead pooled
// connection, sent the batch again on a fresh one and returned nil.
func TestXactLockBatchAnswerLostIsNeitherRetriedNorCalledNotCommitted(t *testing.T) {
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			check := pgtest.Pool(t)
			schema := pgtest.Schema(t, check)
			table := pgx.Identifier{schema, "runs"}.Sanitize()
			_, err := check.Exec(ctx, "CREATE TABLE "+table+" (v int)")
			require.NoError(t, err)
			cfg := pgtest.Config(t)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = mode
			proxy := proxied(t, cfg)
			pool, err := pgxpool.NewWithConfig(ctx, cfg) // not pgtest.NewPool: its end check would race the dropped session's end
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			l := newLocker(t, pool, advisory.Config{})
			ks := []keys.Key{key(t)}
			run := func() error {
				b := &pgx.Batch{}
				b.Queue("INSERT INTO " + table + " (v) VALUES (1)")
				return l.WithXactLockBatch(ctx, ks, nil, b)
			}
			require.NoError(t, run()) // warm: the statements are prepared, the connection open

			proxy.DropNextAnswer()
			err = run()
			require.True(t, proxy.AnswerDropped(), "the proxy dropped an answer")
			t.Logf("the call returned: %v", err)
			switch rows := rowCount(ctx, t, check, table); rows {
			case 2: // this call's batch ran, once
				assert.ErrorIs(t, err, pooltx.ErrCommitUnknown)
				assert.NotErrorIs(t, err, pooltx.ErrNotCommitted)
			case 1: // the answer lost was to the statements' preparation (describe_exec describes each call): nothing ran
				assert.True(t, errors.Is(err, pooltx.ErrNotCommitted) || errors.Is(err, pooltx.ErrCommitUnknown), "%v", err)
			default:
				t.Fatalf("%d rows: the batch ran %d times", rows, rows-1)
			}
		})
	}
}
