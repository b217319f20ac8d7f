package pgtest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
)

// lockedBuffer collects a cluster's log; Stop writes it from the cleanup goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Cluster starts a private throwaway cluster owned by this test, for tests that restart,
// stop or break the server. It is stopped and removed at cleanup; if the test failed, the
// server log is logged. It needs local PostgreSQL server binaries whatever
// PGXLOCK_TEST_DATABASE says, and fails the test (never skips) without them. Connect with
// c.DSN(), e.g. through a config from pgxpool.ParseConfig passed to [NewPool].
func Cluster(t testing.TB) *pglaunch.Cluster {
	t.Helper()
	log := &lockedBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pglaunch.Start(ctx, pglaunch.Options{Log: log})
	if errors.Is(err, pglaunch.ErrNoBinaries) {
		t.Fatalf("pgtest: this test needs its own PostgreSQL cluster, so it needs the PostgreSQL server binaries: %v\n"+
			"Fix it with one command (Debian, Ubuntu): %s\n"+
			"(elsewhere: dnf install postgresql-server, brew install postgresql)", err, SetupCommand())
	}
	if err != nil {
		t.Fatalf("pgtest: start a private cluster: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("pgtest: stop private cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("pgtest: private cluster log:\n%s", log.String())
		}
	})
	return c
}

// Replicated starts a private throwaway primary (as [Cluster] does) and a streaming
// standby of it ([pglaunch.Cluster.StartStandby] with opts), both owned by this test and
// removed at cleanup (their server logs are logged if the test failed). Like [Cluster] it
// needs local PostgreSQL server binaries whatever PGXLOCK_TEST_DATABASE says, and fails
// the test without them. Connect with [pglaunch.MultiHostDSN](primary, standby) to follow
// a promotion.
func Replicated(t testing.TB, opts pglaunch.StandbyOptions) (primary, standby *pglaunch.Cluster) {
	t.Helper()
	primary = Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	standby, err := primary.StartStandby(ctx, opts)
	if err != nil {
		t.Fatalf("pgtest: start a standby: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := standby.Stop(ctx); err != nil {
			t.Errorf("pgtest: stop standby: %v", err)
		}
	})
	return primary, standby
}
