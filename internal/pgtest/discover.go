package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// EnvDatabase names the environment variable holding the test database's DSN.
const EnvDatabase = "PGXLOCK_TEST_DATABASE"

// dockerImage is the image used when the database comes from Docker.
const dockerImage = "postgres:15-alpine"

// database is what discovery found.
type database struct {
	DSN  string
	Via  string                          // for messages: where the database came from
	Stop func(ctx context.Context) error // nil when there is nothing to stop
}

// sources are the effects discovery depends on, injectable so that the order and the
// messages can be tested without starting anything.
type sources struct {
	LookupEnv    func(key string) (string, bool)
	FindBinDir   func() (string, error)
	DockerCheck  func(ctx context.Context) error
	LaunchLocal  func(ctx context.Context, binDir string) (database, error)
	LaunchDocker func(ctx context.Context) (database, error)
	Ping         func(ctx context.Context, dsn string) error
}

// howToFix ends a discovery failure that installing PostgreSQL fixes: first the one
// command that fixes a Debian or Ubuntu machine, then every way ([waysToFix]).
func howToFix() string {
	return `Fix it with one command (Debian, Ubuntu: installs PostgreSQL's server binaries and
PgBouncer with apt-get, through sudo unless you are root; the tests then start a
throwaway cluster by themselves):
    ` + SetupCommand() + `
Or ` + waysToFix()
}

// waysToFix ends every other discovery failure (a DSN that does not answer, binaries
// that are present but fail).
func waysToFix() string {
	return `do one of these, then run the tests again:
  - point the tests at a server you have: ` + EnvDatabase + `=postgres://user:password@localhost:5432/dbname?sslmode=disable
  - install the PostgreSQL server binaries, and the tests start a throwaway cluster:
    apt-get install postgresql (Debian, Ubuntu), dnf install postgresql-server (Fedora),
    brew install postgresql (macOS)
  - run a Docker engine, and the tests start ` + dockerImage + ` through testcontainers-go`
}

// discover finds the test database in the documented order: the environment variable,
// local binaries, Docker. It stops at the first source that is present; a present source
// that fails is an error (it is not skipped). The DSN must answer s.Ping.
func discover(ctx context.Context, s sources) (database, error) {
	db, err := pick(ctx, s)
	if err != nil {
		return database{}, err
	}
	if err := s.Ping(ctx, db.DSN); err != nil {
		if db.Stop != nil {
			err = errors.Join(err, db.Stop(context.WithoutCancel(ctx)))
		}
		return database{}, fmt.Errorf("pgtest: the database from %s does not answer (%s): %w\nTo fix it, %s", db.Via, redact(db.DSN), err, waysToFix())
	}
	return db, nil
}

func pick(ctx context.Context, s sources) (database, error) {
	if dsn, ok := s.LookupEnv(EnvDatabase); ok && strings.TrimSpace(dsn) != "" {
		return database{DSN: strings.TrimSpace(dsn), Via: EnvDatabase}, nil
	}
	binDir, binErr := s.FindBinDir()
	if binErr == nil {
		db, err := s.LaunchLocal(ctx, binDir)
		if err != nil {
			return database{}, fmt.Errorf("pgtest: %s is not set; PostgreSQL server binaries are in %s, but a throwaway cluster did not start: %w\nTo fix it, %s", EnvDatabase, binDir, err, waysToFix())
		}
		return db, nil
	}
	dockerErr := s.DockerCheck(ctx)
	if dockerErr == nil {
		db, err := s.LaunchDocker(ctx)
		if err != nil {
			return database{}, fmt.Errorf("pgtest: %s is not set, no PostgreSQL server binaries were found, and Docker answers but %s did not start: %w\n%s", EnvDatabase, dockerImage, err, howToFix())
		}
		return db, nil
	}
	return database{}, fmt.Errorf(`pgtest: no PostgreSQL server for the tests. Tried, in order:
  1. %s: not set
  2. local PostgreSQL server binaries: %v
  3. Docker (testcontainers-go): %v
%s`, EnvDatabase, binErr, dockerErr, howToFix())
}

// realSources are the sources used by DSN.
func realSources(lookupEnv func(string) (string, bool)) sources {
	return sources{
		LookupEnv:    lookupEnv,
		FindBinDir:   pglaunch.FindBinDir,
		DockerCheck:  dockerCheck,
		LaunchLocal:  launchLocal,
		LaunchDocker: launchDocker,
		Ping:         ping,
	}
}

func launchLocal(ctx context.Context, binDir string) (database, error) {
	t0 := time.Now()
	c, err := pglaunch.Start(ctx, pglaunch.Options{BinDir: binDir})
	if err != nil {
		return database{}, err
	}
	return database{
		DSN:  c.DSN(),
		Via:  fmt.Sprintf("a throwaway cluster from %s (started in %v)", binDir, time.Since(t0).Round(time.Millisecond)),
		Stop: c.Stop,
	}, nil
}

// dockerCheck asks the Docker engine for its info; without an engine it fails at once.
func dockerCheck(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("docker provider panicked: %v", r)
		}
	}()
	p, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return p.Health(ctx) // closes the provider
}

func launchDocker(ctx context.Context) (database, error) {
	t0 := time.Now()
	ctr, err := tcpostgres.Run(ctx, dockerImage,
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmd("postgres",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=200"),
	)
	if err != nil {
		return database{}, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return database{}, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	return database{
		DSN: dsn,
		Via: fmt.Sprintf("a %s container (started in %v)", dockerImage, time.Since(t0).Round(time.Millisecond)),
		Stop: func(ctx context.Context) error {
			return testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
		},
	}, nil
}

func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return errors.Join(conn.Ping(ctx), conn.Close(ctx))
}

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redact hides the password of a DSN (URL or key=value form) for messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}
