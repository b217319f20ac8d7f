package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var running = regexp.MustCompile(`(?m)^\S+ (\S+)\s+tick (\S+)  running the job$`)

// Three replicas on gocron with the pgxlock Locker: every tick that ran was run by exactly
// one replica, and the summary agrees with the log.
func TestReplicasOnGocron(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out syncBuilder
	cfg := config{URL: pgtest.DSN(t), Replicas: 3, Name: "g", Every: 300 * time.Millisecond,
		JobTime: 50 * time.Millisecond, Duration: 1500 * time.Millisecond}
	require.NoError(t, run(ctx, cfg, &out))
	t.Log("\n" + out.String())
	ran := map[string][]string{}
	for _, m := range running.FindAllStringSubmatch(out.String(), -1) {
		ran[m[2]] = append(ran[m[2]], m[1])
	}
	require.NotEmpty(t, ran, "no tick ran")
	for tick, replicas := range ran {
		require.Len(t, replicas, 1, "tick %s run by %v", tick, replicas)
	}
	require.Contains(t, out.String(), "summary: ticks run per replica: ")
}
