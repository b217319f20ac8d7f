package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func parseLocksJSON(t *testing.T, out string) locksJSON {
	t.Helper()
	var doc locksJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc), "output: %s", out)
	return doc
}

func locksOn(doc locksJSON, key keys.Key) []lockJSON {
	var out []lockJSON
	for _, l := range doc.Locks {
		if l.Key == key.String() {
			out = append(out, l)
		}
	}
	return out
}

// `locks` shows a lock held by the test: key, pid, mode, granted, the
// holder's application_name; the text table contains the key.
func TestLocksShowsHolder(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	pid := hold(t, pool, key)
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]

	code, out, stderr := runCLI(t, nil, "locks", "--json")
	require.Equal(t, 0, code, stderr)
	doc := parseLocksJSON(t, out)
	got := locksOn(doc, key)
	require.Len(t, got, 1, "locks: %s", out)
	l := got[0]
	assert.Equal(t, pid, l.PID)
	assert.True(t, l.Granted)
	assert.Equal(t, "exclusive", l.Mode)
	assert.Equal(t, "int64", l.Space)
	v, _ := key.Int64()
	require.NotNil(t, l.Int64)
	assert.Equal(t, strconv.FormatInt(v, 10), *l.Int64)
	assert.Nil(t, l.Pair)
	assert.Equal(t, app, l.ApplicationName)
	assert.Equal(t, "idle", l.State)
	require.NotNil(t, l.HeldMaxSeconds)
	require.NotNil(t, l.HeldMinSeconds, "an idle holder has a lower bound")
	assert.LessOrEqual(t, *l.HeldMinSeconds, *l.HeldMaxSeconds)
	assert.Nil(t, l.WaitedSeconds)
	assert.Equal(t, []int32{}, l.BlockedBy)
	assert.Nil(t, l.Query, "no query without --show-query")
	assert.False(t, doc.At.IsZero())
	assert.NotEmpty(t, doc.Database)

	code, out, stderr = runCLI(t, nil, "locks")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "KEY")
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, key.String()+" ") {
			line = l
		}
	}
	require.NotEmpty(t, line, "no row for %s in:\n%s", key, out)
	assert.Equal(t, []string{key.String(), "exclusive", "held", strconv.Itoa(int(pid)), app, "idle"}, strings.Fields(line)[:6])
	assert.Contains(t, out, "FOR: waiters")
}

// A waiter shows as waiting, blocked by the holder's pid; --key filters;
// the namespace name given with --ns shows in the key.
func TestLocksShowsWaiterAndBlocker(t *testing.T) {
	pool := pgtest.Pool(t)
	nsID := pgtest.UniqueInt32(t)
	key := keys.Pair(nsID, 42)
	other := keys.Int64(pgtest.UniqueInt64(t))
	holder := hold(t, pool, key)
	hold(t, pool, other)

	// A second session waits for key.
	conn, err := pool.Acquire(ctxT(t))
	require.NoError(t, err)
	defer conn.Release()
	var waiter int32
	require.NoError(t, conn.QueryRow(ctxT(t), "SELECT pg_backend_pid()").Scan(&waiter))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		// Ends with an error when the test cancels the wait below.
		_, _ = conn.Exec(ctx, lockSQL(key, "pg_advisory_lock"))
	}()
	defer func() {
		_, _ = pool.Exec(context.Background(), "SELECT pg_cancel_backend($1)", waiter)
		wg.Wait()
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
	}()
	waitFor(t, waitTimeout, "the waiter to wait", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctxT(t), "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype = 'advisory'", waiter).Scan(&n))
		return n == 1
	})

	ns := "ns-test-" + strconv.FormatUint(uint64(uint32(nsID)), 16)
	code, out, stderr := runCLI(t, nil, "locks", "--json", "--ns", ns+"="+strconv.Itoa(int(nsID)), "--key", "ns:"+ns+"/42")
	require.Equal(t, 0, code, stderr)
	doc := parseLocksJSON(t, out)
	require.Len(t, doc.Locks, 2, "only the filtered key: %s", out)
	h, w := doc.Locks[0], doc.Locks[1]
	wantKey := "ns:" + ns + "(" + strconv.Itoa(int(nsID)) + ")/42"
	for _, l := range doc.Locks {
		assert.Equal(t, wantKey, l.Key)
		assert.Equal(t, ns, l.Namespace)
		assert.Equal(t, "pair", l.Space)
		require.NotNil(t, l.Pair)
		assert.Equal(t, [2]int32{nsID, 42}, *l.Pair)
		assert.Nil(t, l.Int64)
	}
	assert.True(t, h.Granted)
	assert.Equal(t, holder, h.PID)
	assert.False(t, w.Granted)
	assert.Equal(t, waiter, w.PID)
	assert.Equal(t, []int32{holder}, w.BlockedBy)
	assert.Nil(t, w.HeldMaxSeconds)

	// The same in text, filtered by the pair syntax.
	code, out, stderr = runCLI(t, nil, "locks", "--key", strconv.Itoa(int(nsID))+",42")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "pair:"+strconv.Itoa(int(nsID))+",42")
	assert.Regexp(t, `\swaiting\s+`+strconv.Itoa(int(waiter))+`\s.*\s`+strconv.Itoa(int(holder))+`\n`, out)
	assert.NotContains(t, out, other.String(), "--key filters")
	// A pair whose first number no namespace names gets one hint, under the table.
	hint := "PAIR KEYS: the first number of pair:A,B may be a namespace id (here: " + strconv.Itoa(int(nsID)) + ")"
	assert.Equal(t, 1, strings.Count(out, hint), out)
	assert.Contains(t, out, "--ns NAME="+strconv.Itoa(int(nsID)))
	assert.Contains(t, out, "PGXLOCK_NAMESPACES=")
	assert.Greater(t, strings.Index(out, hint), strings.Index(out, "BLOCKED BY"), "under the table")

	// Named: no hint, and the name shows.
	code, out, stderr = runCLI(t, nil, "locks", "--ns", ns+"="+strconv.Itoa(int(nsID)), "--key", strconv.Itoa(int(nsID))+",42")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, wantKey)
	assert.NotContains(t, out, "PAIR KEYS")
	code, out, stderr = runCLI(t, []string{"PGXLOCK_NAMESPACES=" + ns + "=" + strconv.Itoa(int(nsID))}, "locks", "--key", strconv.Itoa(int(nsID))+",42")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, wantKey)
	assert.NotContains(t, out, "PAIR KEYS")
	// An int64 key needs no hint.
	code, out, stderr = runCLI(t, nil, "locks", "--key", other.String())
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "PAIR KEYS")
}

// --key with a string shows the hashed key by number only: the source
// string never appears in the output.
func TestLocksHashedKeyNeverShowsSource(t *testing.T) {
	pool := pgtest.Pool(t)
	src := "secret-customer-" + strconv.FormatUint(uint64(pgtest.UniqueInt64(t)), 36)
	key := keys.Hash(src)
	hold(t, pool, key)
	for _, args := range [][]string{{"locks", "--key", src}, {"locks", "--key", src, "--json"}, {"locks"}} {
		code, out, stderr := runCLI(t, nil, args...)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, strings.TrimPrefix(key.String(), "int64:"))
		assert.NotContains(t, out, src)
		assert.NotContains(t, stderr, src)
	}
}

func TestLocksNoneAndUsage(t *testing.T) {
	key := keys.Int64(pgtest.UniqueInt64(t))
	code, out, stderr := runCLI(t, nil, "locks", "--key", key.String())
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "no advisory locks held or awaited\n", out)

	code, out, stderr = runCLI(t, nil, "locks", "--key", key.String(), "--json")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, []lockJSON{}, parseLocksJSON(t, out).Locks)
	assert.Contains(t, out, `"locks":[]`)
}

// --watch redraws until interrupted; run in-process with the context as
// the interrupt.
func TestLocksWatch(t *testing.T) {
	pool := pgtest.Pool(t)
	key := keys.Int64(pgtest.UniqueInt64(t))
	hold(t, pool, key)
	env := []string{"DATABASE_URL=" + pgtest.DSN(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"locks", "--watch", "--interval", "20ms", "--json", "--key", key.String()}, nil, &out, &errOut, env)
	}()
	waitFor(t, waitTimeout, "three frames", func() bool { return strings.Count(out.String(), "\n") >= 3 })
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errOut.String())
	case <-time.After(waitTimeout):
		t.Fatal("locks --watch did not stop")
	}
	for l := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		doc := parseLocksJSON(t, l)
		require.Len(t, doc.Locks, 1)
		assert.Equal(t, key.String(), doc.Locks[0].Key)
	}
}

// The built binary stops watching on SIGINT and exits 0.
func TestLocksWatchStopsOnSIGINT(t *testing.T) {
	key := keys.Int64(pgtest.UniqueInt64(t))
	p := startCLI(t, "", nil, "locks", "--watch", "--interval", "20ms", "--key", key.String())
	waitFor(t, waitTimeout, "two frames", func() bool { return strings.Count(p.stdout.String(), "no advisory locks") >= 2 })
	p.signal(syscall.SIGINT)
	assert.Equal(t, 0, p.wait(), p.stderr.String())
}

// blockedWriter is a stream nobody reads: every Write blocks until the test
// ends; entered is closed at the first.
type blockedWriter struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return len(p), nil
}

// --watch ends on a signal (here its context) with status 0 also when
// nobody reads its stdout (review 31j: the blocked write held the loop, and
// SIGINT and SIGTERM were ignored).
func TestLocksWatchStopsWithAStuckStdout(t *testing.T) {
	key := keys.Int64(pgtest.UniqueInt64(t))
	env := []string{"DATABASE_URL=" + pgtest.DSN(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck := &blockedWriter{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(stuck.release)
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"locks", "--watch", "--interval", "20ms", "--key", key.String()}, nil, stuck, &errOut, env)
	}()
	<-stuck.entered // the first frame is being written, and blocks
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errOut.String())
	case <-time.After(waitTimeout):
		t.Fatal("locks --watch did not stop")
	}
}
