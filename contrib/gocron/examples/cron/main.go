// Command cron is examples/cron on gocron: several replicas run the same gocron
// scheduler, and pgxlock's gocron Locker (contrib/gocron) makes each tick's job run on one
// replica at a time while the others skip it.
//
//	cd contrib/gocron && go run ./examples/cron                 # 3 replicas as goroutines, 10 s
//	export DATABASE_URL=postgres://...                           # one replica per process: one
//	go run ./examples/cron --replicas=1 --name=a &              # shared server (without it each
//	go run ./examples/cron --replicas=1 --name=b &              # process starts a cluster of its own)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/keys"
)

// config is the command line.
type config struct {
	URL      string        // database; "" starts a throwaway cluster
	Replicas int           // replicas run as goroutines in this process
	Name     string        // replica name (a suffix is added when Replicas > 1)
	Every    time.Duration // schedule
	JobTime  time.Duration // how long the job takes
	Duration time.Duration // stop after this long; 0 runs until interrupted
}

// The job's name is gocron's lock key; under the namespace its advisory key is
// jobsNS.Hash(jobName) ("pgxlock locks --ns cron-gocron=1002 --key ns:cron-gocron/hash:nightly-report").
var jobsNS = keys.MustRegisterNamespace(1002, "cron-gocron")

const (
	jobName = "nightly-report"
	schema  = "pgxlock_example_cron_gocron"
)

func main() {
	var cfg config
	flag.IntVar(&cfg.Replicas, "replicas", 3, "replicas to run in this process, as goroutines")
	flag.StringVar(&cfg.Name, "name", "replica", "replica name; with --replicas>1, -1, -2... are appended")
	flag.DurationVar(&cfg.Every, "every", time.Second, "run the job on every multiple of this interval")
	flag.DurationVar(&cfg.JobTime, "job-time", 300*time.Millisecond, "how long the job takes")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Second, "stop after this long (0: run until interrupted)")
	flag.Parse()
	cfg.URL = os.Getenv(exampledb.EnvURL)
	exampledb.Main("cron-gocron", func(ctx context.Context) error { return run(ctx, cfg, os.Stdout) })
}

// run starts the replicas' schedulers, lets them run for cfg.Duration (or until ctx
// ends), shuts them down, and prints who ran which tick.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Replicas < 1 || cfg.Every <= 0 || cfg.JobTime < 0 || cfg.Duration < 0 {
		return errors.New("need --replicas >= 1, --every > 0, --job-time >= 0, --duration >= 0")
	}
	db, err := exampledb.Open(ctx, cfg.URL, os.Stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-cron-gocron", MaxConns: 1, Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS cron_runs (
		job text NOT NULL, tick timestamptz NOT NULL, replica text NOT NULL,
		PRIMARY KEY (job, tick))`); err != nil {
		return err
	}
	lg := &logger{out: out}
	lg.printf("%d replica(s), gocron job %q every %v, namespace %v", cfg.Replicas, jobName, cfg.Every, jobsNS)

	start := time.Now().Truncate(cfg.Every) // the summary counts ticks from here
	var scheds []gocron.Scheduler
	defer func() {
		for _, s := range scheds {
			_ = s.Shutdown()
		}
	}()
	for i := range cfg.Replicas {
		name := cfg.Name
		if cfg.Replicas > 1 {
			name = fmt.Sprintf("%s-%d", cfg.Name, i+1)
		}
		s, err := replica(ctx, db, name, cfg, lg)
		if err != nil {
			return err
		}
		scheds = append(scheds, s)
	}
	if cfg.Duration > 0 {
		select {
		case <-time.After(cfg.Duration):
		case <-ctx.Done():
		}
	} else {
		<-ctx.Done()
	}
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			return err
		}
	}
	scheds = nil
	var counts []string
	rows, err := pool.Query(context.WithoutCancel(ctx), `SELECT replica, count(*) FROM cron_runs
		WHERE job = $1 AND tick >= $2 GROUP BY replica ORDER BY replica`, jobName, start)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r string
		var n int
		if err := rows.Scan(&r, &n); err != nil {
			return err
		}
		counts = append(counts, fmt.Sprintf("%s: %d", r, n))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	lg.printf("summary: ticks run per replica: %s", strings.Join(counts, ", "))
	return nil
}

// replica starts one gocron scheduler with its own pool (its own sessions, as a separate
// process would have) and the pgxlock gocron Locker.
func replica(ctx context.Context, db *exampledb.DB, name string, cfg config, lg *logger) (gocron.Scheduler, error) {
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-cron-gocron-" + name, MaxConns: 2, Schema: schema})
	if err != nil {
		return nil, err
	}
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		pool.Close()
		return nil, err
	}
	jobs, err := pgxlockgocron.NewLocker(locker, pgxlockgocron.Config{Namespace: jobsNS})
	if err != nil {
		pool.Close()
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(jobs))
	if err != nil {
		pool.Close()
		return nil, err
	}
	// The first run is the next multiple of cfg.Every, so that the replicas' ticks
	// coincide (on machines whose clocks agree).
	start := time.Now().Truncate(cfg.Every).Add(cfg.Every)
	_, err = s.NewJob(gocron.DurationJob(cfg.Every),
		gocron.NewTask(func(ctx context.Context) { runJob(ctx, pool, name, cfg, lg) }),
		gocron.WithName(jobName),
		gocron.WithStartAt(gocron.WithStartDateTime(start)),
		gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
			if errors.Is(err, advisory.ErrNotAcquired) {
				lg.printf("%-10s skipped: another replica holds the lock and is running this tick", name)
			} else {
				lg.printf("%-10s lock failed: %v", name, err)
			}
		})))
	if err != nil {
		_ = s.Shutdown()
		pool.Close()
		return nil, err
	}
	s.Start()
	// The pool closes after the scheduler: wrap Shutdown.
	return closingScheduler{s, pool.Close}, nil
}

// runJob runs under the job's lock. Like examples/cron it first records the tick (the
// multiple of cfg.Every nearest to now) in cron_runs, so that a replica whose tick fired
// late, after the winner had released the lock, does not run the same tick again.
func runJob(ctx context.Context, pool *pgxpool.Pool, name string, cfg config, lg *logger) {
	tick := time.Now().Round(cfg.Every)
	label := tick.Format("15:04:05.000")
	tag, err := pool.Exec(ctx, `INSERT INTO cron_runs (job, tick, replica) VALUES ($1, $2, $3)
		ON CONFLICT DO NOTHING`, jobName, tick, name)
	switch {
	case err != nil && ctx.Err() != nil:
		lg.printf("%-10s tick %s  stopped: the scheduler is shutting down", name, label)
		return
	case err != nil:
		lg.printf("%-10s tick %s  failed: %v", name, label, err)
		return
	case tag.RowsAffected() == 0:
		lg.printf("%-10s tick %s  skipped: another replica already ran this tick", name, label)
		return
	}
	lg.printf("%-10s tick %s  running the job", name, label)
	select { // the job itself: here just a wait
	case <-time.After(cfg.JobTime):
	case <-ctx.Done():
	}
}

// closingScheduler closes the replica's pool after its scheduler has shut down.
type closingScheduler struct {
	gocron.Scheduler
	closePool func()
}

// Shutdown shuts the scheduler down (waiting for a running job), then closes the pool.
func (c closingScheduler) Shutdown() error {
	err := c.Scheduler.Shutdown()
	c.closePool()
	return err
}

// logger prints whole lines (replicas share it).
type logger struct {
	mu  sync.Mutex
	out io.Writer
}

func (l *logger) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
