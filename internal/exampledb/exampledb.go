// Package exampledb gives the runnable programs under examples/ a database: the one
// DATABASE_URL names or, when it is unset, a throwaway PostgreSQL cluster started from the
// local server binaries through internal/pglaunch and stopped when the program ends,
// interrupted (SIGINT, SIGTERM) or not.
//
// It does not import "testing"; the examples' tests pass DATABASE_URL instead.
package exampledb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
)

// EnvURL names the environment variable holding the examples' connection string.
const EnvURL = "DATABASE_URL"

// DB is the database an example runs against. Close it to stop a throwaway cluster.
type DB struct {
	// URL is the connection string: DATABASE_URL's, or the throwaway cluster's.
	URL string

	cluster *pglaunch.Cluster // nil when URL came from the environment
	log     io.Writer
}

// Open returns the database named by url or, when url is empty, starts a throwaway local
// cluster (about a second; less once pglaunch has cached a template data directory) and
// says so on log. ctx bounds the start; a cluster that fails to start leaves nothing behind.
func Open(ctx context.Context, url string, log io.Writer) (*DB, error) {
	if log == nil {
		log = io.Discard
	}
	if url != "" {
		return &DB{URL: url, log: log}, nil
	}
	fmt.Fprintf(log, "%s is not set: starting a throwaway PostgreSQL cluster from the local binaries...\n", EnvURL)
	t0 := time.Now()
	c, err := pglaunch.Start(ctx, pglaunch.Options{})
	if errors.Is(err, pglaunch.ErrNoBinaries) {
		return nil, fmt.Errorf("no database: %w\n"+
			"Fix it with one command, from the repository root (Debian, Ubuntu: installs PostgreSQL's server binaries\n"+
			"with apt-get, through sudo unless you are root):\n    bash .ci/setup\n"+
			"Or set %s to a PostgreSQL connection string, or install the PostgreSQL server binaries\n"+
			"elsewhere (dnf install postgresql-server, brew install postgresql)", err, EnvURL)
	}
	if err != nil {
		return nil, fmt.Errorf("start a throwaway PostgreSQL cluster: %w", err)
	}
	fmt.Fprintf(log, "throwaway cluster up on 127.0.0.1:%d in %v (it is stopped and deleted on exit)\n",
		c.Port(), time.Since(t0).Round(time.Millisecond))
	return &DB{URL: c.DSN(), cluster: c, log: log}, nil
}

// Throwaway reports whether the database is a throwaway cluster started by Open.
func (db *DB) Throwaway() bool { return db.cluster != nil }

// Close stops and deletes a throwaway cluster; it does nothing for a DATABASE_URL
// database. It runs on its own bounded context, so it works after the program's context
// was cancelled by a signal.
func (db *DB) Close() error {
	if db.cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.cluster.Stop(ctx); err != nil {
		return fmt.Errorf("stop the throwaway cluster: %w", err)
	}
	fmt.Fprintln(db.log, "throwaway cluster stopped and deleted")
	return nil
}

// PoolOptions configure [DB.Pool].
type PoolOptions struct {
	// AppName is the application_name its sessions show in pg_stat_activity.
	AppName string
	// MaxConns caps the pool; 0 means pgxpool's default.
	MaxConns int32
	// Schema, if not empty, is created when missing and becomes the sessions'
	// search_path, so that an example's tables stay out of the way of anything else
	// in a DATABASE_URL database.
	Schema string
	// Configure, if not nil, adjusts the configuration last (a tracer, say).
	Configure func(*pgxpool.Config)
}

// Pool opens a pool on the database and checks that it connects.
func (db *DB) Pool(ctx context.Context, o PoolOptions) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", EnvURL, err)
	}
	if o.AppName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = o.AppName
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if o.Schema != "" {
		if err := createSchema(ctx, cfg.ConnConfig.Copy(), o.Schema); err != nil {
			return nil, err
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{o.Schema}.Sanitize()
	}
	if o.Configure != nil {
		o.Configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// createSchema creates schema if it does not exist. Several processes may do so at once:
// IF NOT EXISTS does not stop two concurrent creations from colliding in the catalog, so
// that collision counts as success.
func createSchema(ctx context.Context, cc *pgx.ConnConfig, schema string) error {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}

// Main runs an example's body with a context that is cancelled on SIGINT or SIGTERM, so
// that the body's deferred clean-up (pools, a throwaway cluster) runs on Ctrl-C too.
// It prints the body's error on stderr prefixed with name and exits 1, or 130 when
// the run ended because of a signal. A second signal, once the first has cancelled the
// context, kills the program at once (pglaunch then reaps the orphaned cluster on its next
// start).
func Main(name string, body func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // restore default handling: the next Ctrl-C is not swallowed
	}()
	err := body(ctx)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		if err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: interrupted\n", name)
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
