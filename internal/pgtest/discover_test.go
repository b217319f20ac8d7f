package pgtest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSources records which sources discovery consulted, in order.
type fakeSources struct {
	env       string // "" = unset
	binDir    string // "" = not found
	dockerUp  bool
	localErr  error
	dockerErr error
	pingErr   error
	calls     []string
	stopped   []string
}

func (f *fakeSources) sources() sources {
	stop := func(name string) func(context.Context) error {
		return func(context.Context) error { f.stopped = append(f.stopped, name); return nil }
	}
	return sources{
		LookupEnv: func(key string) (string, bool) {
			f.calls = append(f.calls, "env:"+key)
			return f.env, f.env != ""
		},
		FindBinDir: func() (string, error) {
			f.calls = append(f.calls, "bindir")
			if f.binDir == "" {
				return "", errors.New("no initdb in /usr/lib/postgresql/*/bin")
			}
			return f.binDir, nil
		},
		DockerCheck: func(context.Context) error {
			f.calls = append(f.calls, "dockercheck")
			if !f.dockerUp {
				return errors.New("Cannot connect to the Docker daemon")
			}
			return nil
		},
		LaunchLocal: func(_ context.Context, binDir string) (database, error) {
			f.calls = append(f.calls, "local:"+binDir)
			if f.localErr != nil {
				return database{}, f.localErr
			}
			return database{DSN: "postgres://local", Via: "local", Stop: stop("local")}, nil
		},
		LaunchDocker: func(context.Context) (database, error) {
			f.calls = append(f.calls, "docker")
			if f.dockerErr != nil {
				return database{}, f.dockerErr
			}
			return database{DSN: "postgres://docker", Via: "docker", Stop: stop("docker")}, nil
		},
		Ping: func(_ context.Context, dsn string) error {
			f.calls = append(f.calls, "ping:"+dsn)
			return f.pingErr
		},
	}
}

// The three "ways" every failure message must name.
var fixes = []string{
	EnvDatabase + "=postgres://",
	"apt-get install postgresql",
	"Docker",
}

func TestDiscoverOrder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		f         fakeSources
		wantDSN   string
		wantCalls []string
	}{
		{
			name:      "env wins over everything",
			f:         fakeSources{env: "postgres://env", binDir: "/bin/pg", dockerUp: true},
			wantDSN:   "postgres://env",
			wantCalls: []string{"env:" + EnvDatabase, "ping:postgres://env"},
		},
		{
			name:      "blank env counts as unset",
			f:         fakeSources{env: "  ", binDir: "/bin/pg", dockerUp: true},
			wantDSN:   "postgres://local",
			wantCalls: []string{"env:" + EnvDatabase, "bindir", "local:/bin/pg", "ping:postgres://local"},
		},
		{
			name:      "local binaries before docker",
			f:         fakeSources{binDir: "/bin/pg", dockerUp: true},
			wantDSN:   "postgres://local",
			wantCalls: []string{"env:" + EnvDatabase, "bindir", "local:/bin/pg", "ping:postgres://local"},
		},
		{
			name:      "docker last",
			f:         fakeSources{dockerUp: true},
			wantDSN:   "postgres://docker",
			wantCalls: []string{"env:" + EnvDatabase, "bindir", "dockercheck", "docker", "ping:postgres://docker"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			db, err := discover(context.Background(), f.sources())
			require.NoError(t, err)
			assert.Equal(t, tc.wantDSN, db.DSN)
			assert.Equal(t, tc.wantCalls, f.calls)
			assert.Empty(t, f.stopped)
		})
	}
}

func TestDiscoverNothingFails(t *testing.T) {
	f := fakeSources{}
	_, err := discover(context.Background(), f.sources())
	require.Error(t, err)
	assert.Equal(t, []string{"env:" + EnvDatabase, "bindir", "dockercheck"}, f.calls)
	msg := err.Error()
	// The one command first: without binaries or Docker, installing PostgreSQL fixes it.
	assert.Contains(t, msg, "Fix it with one command")
	assert.Contains(t, msg, "\n    "+SetupCommand()+"\n")
	for _, want := range append(fixes,
		"1. "+EnvDatabase+": not set",
		"no initdb in /usr/lib/postgresql/*/bin",
		"Cannot connect to the Docker daemon",
	) {
		assert.Contains(t, msg, want)
	}
	t.Log(msg)
}

// Binaries that are present but broken fail loudly instead of falling through to Docker.
func TestDiscoverLocalFailureIsFatal(t *testing.T) {
	f := fakeSources{binDir: "/bin/pg", dockerUp: true, localErr: errors.New("initdb: could not create directory")}
	_, err := discover(context.Background(), f.sources())
	require.Error(t, err)
	assert.NotContains(t, f.calls, "docker")
	assert.Contains(t, err.Error(), "initdb: could not create directory")
	assert.Contains(t, err.Error(), "/bin/pg")
	for _, want := range fixes {
		assert.Contains(t, err.Error(), want)
	}
}

func TestDiscoverDockerFailure(t *testing.T) {
	f := fakeSources{dockerUp: true, dockerErr: errors.New("pull access denied")}
	_, err := discover(context.Background(), f.sources())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pull access denied")
	assert.Contains(t, err.Error(), dockerImage)
}

// A database that does not answer is reported, and one the harness started is stopped.
func TestDiscoverPingFailureStopsLaunched(t *testing.T) {
	f := fakeSources{binDir: "/bin/pg", pingErr: errors.New("connection refused")}
	_, err := discover(context.Background(), f.sources())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Equal(t, []string{"local"}, f.stopped)

	f = fakeSources{env: "postgres://u:secret@h/db", pingErr: errors.New("connection refused")}
	_, err = discover(context.Background(), f.sources())
	require.Error(t, err)
	assert.Contains(t, err.Error(), EnvDatabase)
	assert.NotContains(t, err.Error(), "secret")
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db?password=secret":             "postgres://u@h/db?password=xxxxx",
		"host=h user=u password=secret dbname=db":       "host=h user=u password=xxxxx dbname=db",
		"host=h password='se cret' dbname=db":           "host=h password=xxxxx dbname=db",
		"postgres://postgres@127.0.0.1:5432/postgres":   "postgres://postgres@127.0.0.1:5432/postgres",
	} {
		assert.Equal(t, want, redact(in), in)
	}
}

// The real discovery with the environment variable unset: the throwaway-cluster path runs
// here even when the rest of the suite uses PGXLOCK_TEST_DATABASE.
func TestDiscoverRealThrowaway(t *testing.T) {
	unset := func(string) (string, bool) { return "", false }
	ctx := context.Background()
	db, err := discover(ctx, realSources(unset))
	require.NoError(t, err, "this test needs PostgreSQL server binaries, e.g. apt-get install postgresql")
	t.Logf("%s: %s", db.Via, db.DSN)
	assert.True(t, strings.HasPrefix(db.DSN, "postgres://postgres@127.0.0.1:"), db.DSN)
	assert.Contains(t, db.Via, "throwaway cluster")
	require.NotNil(t, db.Stop)
	require.NoError(t, db.Stop(ctx))
	assert.Error(t, ping(ctx, db.DSN), "server still answers after Stop")
}

// Without a Docker engine the check fails fast and says why.
func TestDockerCheckWithoutEngine(t *testing.T) {
	if os.Getenv("DOCKER_HOST") != "" {
		t.Skip("DOCKER_HOST is set: a Docker engine may answer")
	}
	if _, err := os.Stat("/var/run/docker.sock"); err == nil {
		t.Skip("a Docker socket exists")
	}
	err := dockerCheck(context.Background())
	require.Error(t, err)
	t.Log(err)
}
