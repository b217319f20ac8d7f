// Command migrate shows a session-level advisory lock guarding schema migrations when
// several copies of a service start at once (a deployment rolling out N replicas, each
// running its migrations on boot).
//
// Every copy takes the same lock before it looks at schema_migrations. The first applies
// the pending migrations; the others wait on the lock, then find nothing left to do.
// Without the lock, two copies could both see migration 002 as pending and both apply it.
//
//	go run ./examples/migrate              # starts 4 copies of itself on one database
//	go run ./examples/migrate --procs=1    # one copy (against DATABASE_URL, say)
package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/keys"
)

// The migration set travels inside the binary, so every copy applies the same files.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrationKey is the one lock every copy takes. A string hash is fine for a single,
// well-known lock; other languages derive the same number (see package keys).
var migrationKey = keys.Hash("pgxlock-example:migrations")

// schema holds the example's tables (schema_migrations and what the migrations create).
const schema = "pgxlock_example_migrate"

func main() {
	procs := flag.Int("procs", 4, "copies to start; 1 migrates in this process")
	name := flag.String("name", fmt.Sprintf("pid %d", os.Getpid()), "label for this copy's log lines")
	flag.Parse()
	exampledb.Main("migrate", func(ctx context.Context) error {
		db, err := exampledb.Open(ctx, os.Getenv(exampledb.EnvURL), os.Stderr)
		if err != nil {
			return err
		}
		defer db.Close()
		if *procs > 1 {
			return launch(ctx, db.URL, *procs)
		}
		return migrate(ctx, db.URL, *name, os.Stdout)
	})
}

// launch starts n copies of this program at once against one database, as a deployment
// would, and waits for them all.
func launch(ctx context.Context, url string, n int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("starting %d copies of %s at once\n", n, self)
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		cmds[i] = exec.CommandContext(ctx, self, "--procs=1", fmt.Sprintf("--name=copy %d", i+1))
		cmds[i].Env = append(os.Environ(), exampledb.EnvURL+"="+url)
		cmds[i].Stdout, cmds[i].Stderr = os.Stdout, os.Stderr
		if err := cmds[i].Start(); err != nil {
			return err
		}
	}
	var errs []error
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("copy %d: %w", i+1, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("all %d copies exited cleanly\n", n)
	return nil
}

// migrate applies the pending migrations under the migration lock.
func migrate(ctx context.Context, url, name string, out io.Writer) error {
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "%s [%s] %s\n", time.Now().Format("15:04:05.000"), name, fmt.Sprintf(format, args...))
	}
	db, err := exampledb.Open(ctx, url, nil)
	if err != nil {
		return err
	}
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-migrate", MaxConns: 2, Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}

	logf("waiting for the migration lock (%v)", migrationKey)
	asked := time.Now()
	// A session lock, not a transaction lock: it spans one transaction per migration, and
	// would also cover statements that cannot run in a transaction (CREATE INDEX
	// CONCURRENTLY). The timeout stops a copy from waiting forever behind a stuck one.
	err = locker.WithLock(ctx, migrationKey, &advisory.Options{Timeout: time.Minute},
		func(ctx context.Context, conn *pgx.Conn) error {
			logf("got the lock after %v", time.Since(asked).Round(time.Millisecond))
			return applyPending(ctx, conn, name, logf)
		})
	if err != nil {
		return err
	}
	logf("released the lock")
	return nil
}

// applyPending applies, in file-name order, every embedded migration not yet recorded in
// schema_migrations, each in its own transaction together with its record. It runs only
// under the migration lock, which is what makes "read what is applied, then apply the
// rest" safe: nobody else can apply anything in between.
func applyPending(ctx context.Context, conn *pgx.Conn, name string, logf func(string, ...any)) error {
	// Concurrent CREATE TABLE IF NOT EXISTS can still fail with a unique violation in the
	// catalog; under the lock it cannot.
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now(),
		applied_by text NOT NULL)`); err != nil {
		return err
	}
	rows, _ := conn.Query(ctx, `SELECT version FROM schema_migrations`)
	done, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	applied := map[string]bool{}
	for _, v := range done {
		applied[v] = true
	}

	files, err := fs.Glob(migrations, "migrations/*.sql") // sorted by name
	if err != nil {
		return err
	}
	pending := 0
	for _, file := range files {
		version := strings.TrimSuffix(strings.TrimPrefix(file, "migrations/"), ".sql")
		if applied[version] {
			continue
		}
		pending++
		sql, err := migrations.ReadFile(file)
		if err != nil {
			return err
		}
		t0 := time.Now()
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_by) VALUES ($1, $2)`, version, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %s: %w", version, err)
		}
		logf("applied %s in %v", version, time.Since(t0).Round(time.Millisecond))
	}
	if pending == 0 {
		logf("nothing to do: all %d migrations already applied", len(files))
	}
	return nil
}
