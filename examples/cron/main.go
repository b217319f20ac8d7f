// Command cron shows a try-lock per tick: several replicas of a service share a schedule,
// and on each tick exactly one of them runs the job while the others skip it.
//
// Each replica, on every tick, tries the job's advisory lock without waiting
// (advisory.Locker.TryHold). The one that gets it runs the job; the rest log "skipped".
// No replica is special: if the one that ran the last tick dies, its session ends, PostgreSQL
// drops its lock, and whichever replica tries first on the next tick takes over.
//
//	go run ./examples/cron                              # 3 replicas as goroutines, 10 s
//	export DATABASE_URL=postgres://...                   # one replica per process: one shared
//	go run ./examples/cron --replicas=1 --name=a &      # server (without DATABASE_URL each
//	go run ./examples/cron --replicas=1 --name=b &      # process starts a throwaway cluster of its own)
//	go run ./examples/cron --metrics-addr=127.0.0.1:9187  # also serve /metrics (Prometheus)
//
// The same service on gocron with pgxlock's gocron Locker is
// contrib/gocron/examples/cron (a module of its own).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/internal/exampledb"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/metrics"
)

// config is the command line.
type config struct {
	URL      string        // database; "" starts a throwaway cluster
	Replicas int           // replicas run as goroutines in this process
	Name     string        // replica name (a suffix is added when Replicas > 1)
	Every    time.Duration // schedule
	JobTime  time.Duration // how long the job takes
	Duration time.Duration // stop ticking after this long; 0 runs until interrupted

	// MetricsAddr, when set, is the address (host:port; port 0 picks one) on which
	// /metrics serves the lock metrics (package metrics) while the replicas run.
	MetricsAddr string
	// beforeMetricsStop, when set (tests), is called with the /metrics URL after the
	// replicas have stopped and before the server does.
	beforeMetricsStop func(url string)
}

// The job's lock. A namespace keeps this service's keys apart from other users of the
// database, and an exact (namespace, job id) key reads back from pg_locks and logs as
// "ns:cron(1001)/1".
var (
	jobsNS   = keys.MustRegisterNamespace(1001, "cron")
	jobName  = "nightly-report"
	jobKey   = jobsNS.Key(1) // job 1: nightly-report
	setupKey = jobsNS.Key(0) // creating the table
)

// schema holds the example's table, cron_runs.
const schema = "pgxlock_example_cron"

func main() {
	var cfg config
	flag.IntVar(&cfg.Replicas, "replicas", 3, "replicas to run in this process, as goroutines")
	flag.StringVar(&cfg.Name, "name", "replica", "replica name; with --replicas>1, -1, -2... are appended")
	flag.DurationVar(&cfg.Every, "every", time.Second, "run the job on every multiple of this interval")
	flag.DurationVar(&cfg.JobTime, "job-time", 300*time.Millisecond, "how long the job takes")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Second, "stop after this long (0: run until interrupted)")
	flag.StringVar(&cfg.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on http://ADDR/metrics while running (e.g. 127.0.0.1:9187)")
	flag.Parse()
	cfg.URL = os.Getenv(exampledb.EnvURL)
	exampledb.Main("cron", func(ctx context.Context) error { return run(ctx, cfg, os.Stdout) })
}

// run starts the replicas, waits for them to finish the schedule, and prints a summary.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Replicas < 1 || cfg.Every <= 0 || cfg.JobTime < 0 || cfg.Duration < 0 {
		return errors.New("need --replicas >= 1, --every > 0, --job-time >= 0, --duration >= 0")
	}
	db, err := exampledb.Open(ctx, cfg.URL, os.Stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := createTable(ctx, db); err != nil {
		return err
	}
	lg := &logger{out: out, every: cfg.Every}
	lg.printf("%d replica(s), job %q every %v, lock %v", cfg.Replicas, jobName, cfg.Every, jobKey)

	// The replicas' lockers report to tracer: nil, or the Prometheus collector.
	var tracer advisory.AcquireTracer
	if cfg.MetricsAddr != "" {
		collector := metrics.New(metrics.Options{Namespaces: []keys.Namespace{jobsNS}}) // its lost_total series exists at zero
		reg := prometheus.NewRegistry()
		reg.MustRegister(collector)
		url, stop, err := serveMetrics(cfg.MetricsAddr, reg)
		if err != nil {
			return err
		}
		defer stop()
		if cfg.beforeMetricsStop != nil {
			defer cfg.beforeMetricsStop(url)
		}
		lg.printf("serving Prometheus metrics on %s", url)
		tracer = collector
	}

	started := time.Now()
	var stopAt time.Time // zero: tick until interrupted
	if cfg.Duration > 0 {
		stopAt = started.Add(cfg.Duration)
	}
	var wg sync.WaitGroup
	errs := make([]error, cfg.Replicas)
	for i := range cfg.Replicas {
		name := cfg.Name
		if cfg.Replicas > 1 {
			name = fmt.Sprintf("%s-%d", cfg.Name, i+1)
		}
		wg.Go(func() { errs[i] = replica(ctx, db, name, cfg, stopAt, tracer, lg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return summary(ctx, db, started, lg)
}

// replica is one instance of the service: its own pool (its own sessions, as a separate
// process would have) and its own clock-aligned ticker.
func replica(ctx context.Context, db *exampledb.DB, name string, cfg config, stopAt time.Time, tracer advisory.AcquireTracer, lg *logger) error {
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-cron-" + name, MaxConns: 2, Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{Tracer: tracer})
	if err != nil {
		return err
	}

	// Ticks are multiples of cfg.Every on the wall clock, so replicas in different
	// processes (on machines whose clocks agree) name the same tick the same way.
	next := time.Now().Truncate(cfg.Every).Add(cfg.Every)
	for stopAt.IsZero() || !next.After(stopAt) {
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil // interrupted: exampledb.Main reports it
		case <-timer.C:
		}
		tick := next
		err := locker.TryHold(ctx, jobKey, nil, func(ctx context.Context) error {
			return runJob(ctx, pool, name, tick, cfg.JobTime, lg)
		})
		switch {
		case errors.Is(err, advisory.ErrNotAcquired):
			lg.tick(name, tick, "skipped: another replica holds the lock and is running this tick")
		case errors.Is(err, advisory.ErrLockLost):
			// The session holding the lock died; another replica may be running the
			// job now. This one stops acting as its owner and tries again next tick.
			lg.tick(name, tick, "lost the lock during the job: %v", err)
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("%s: tick %s: %w", name, lg.label(tick), err)
		}
		// The first tick after now: ticks this replica's job overran are left to the
		// others, not run late.
		next = time.Now().Truncate(cfg.Every).Add(cfg.Every)
	}
	return nil
}

// serveMetrics serves reg on http://addr/metrics until stop, which waits for the server's
// goroutine.
func serveMetrics(addr string, reg *prometheus.Registry) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { // owned: stop waits for it
		defer close(done)
		_ = srv.Serve(ln) // returns http.ErrServerClosed after Shutdown
	}()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-done
	}
	return "http://" + ln.Addr().String() + "/metrics", stop, nil
}

// runJob runs under the lock. It first records the tick in cron_runs: the lock stops two
// replicas from running the job at the same time, and the record stops a replica whose
// timer fired late (after the winner finished and let go of the lock) from running the
// same tick again.
func runJob(ctx context.Context, pool *pgxpool.Pool, name string, tick time.Time, jobTime time.Duration, lg *logger) error {
	lg.tick(name, tick, "got the lock")
	tag, err := pool.Exec(ctx, `INSERT INTO cron_runs (job, tick, replica) VALUES ($1, $2, $3)
		ON CONFLICT DO NOTHING`, jobName, tick, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		lg.tick(name, tick, "skipped: another replica already ran this tick")
		return nil
	}
	lg.tick(name, tick, "running the job")
	t0 := time.Now()

	// The job itself: here just a wait. Real work watches ctx, which is cancelled
	// (cause advisory.ErrLockLost) if the lock's connection dies meanwhile.
	select {
	case <-time.After(jobTime):
	case <-ctx.Done():
		return context.Cause(ctx)
	}

	if _, err := pool.Exec(ctx, `UPDATE cron_runs SET finished_at = clock_timestamp()
		WHERE job = $1 AND tick = $2`, jobName, tick); err != nil {
		return err
	}
	lg.tick(name, tick, "job done in %v, releasing the lock", time.Since(t0).Round(time.Millisecond))
	return nil
}

func createTable(ctx context.Context, db *exampledb.DB) error {
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-cron", MaxConns: 1, Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Close()
	// Several processes may start at once; the lock makes IF NOT EXISTS safe among them.
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}
	return locker.WithXactLock(ctx, setupKey, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS cron_runs (
			job         text        NOT NULL,
			tick        timestamptz NOT NULL,
			replica     text        NOT NULL,
			started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
			finished_at timestamptz,
			PRIMARY KEY (job, tick))`)
		return err
	})
}

// summary prints who ran the ticks of this run, and checks on the database's clock that no
// two runs overlapped.
func summary(ctx context.Context, db *exampledb.DB, since time.Time, lg *logger) error {
	pool, err := db.Pool(ctx, exampledb.PoolOptions{AppName: "pgxlock-example-cron", MaxConns: 1, Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT replica, count(*) FROM cron_runs
		WHERE job = $1 AND tick >= $2 GROUP BY replica ORDER BY replica`, jobName, since)
	if err != nil {
		return err
	}
	var counts []string
	total := 0
	for rows.Next() {
		var replica string
		var n int
		if err := rows.Scan(&replica, &n); err != nil {
			return err
		}
		counts = append(counts, fmt.Sprintf("%s: %d", replica, n))
		total += n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var overlaps int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM cron_runs a JOIN cron_runs b
		ON a.job = b.job AND a.tick < b.tick
		AND tstzrange(a.started_at, a.finished_at) && tstzrange(b.started_at, b.finished_at)
		WHERE a.job = $1 AND a.tick >= $2`, jobName, since).Scan(&overlaps); err != nil {
		return err
	}
	lg.printf("summary: %d ticks, each run by exactly one replica (%s); overlapping runs: %d",
		total, strings.Join(counts, ", "), overlaps)
	return nil
}

// logger prints one line per event, whole lines only (replicas share it).
type logger struct {
	mu    sync.Mutex
	out   io.Writer
	every time.Duration
}

func (l *logger) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func (l *logger) tick(replica string, tick time.Time, format string, args ...any) {
	l.printf("%-10s tick %s  %s", replica, l.label(tick), fmt.Sprintf(format, args...))
}

// label names a tick by its wall-clock time.
func (l *logger) label(tick time.Time) string {
	if l.every%time.Second == 0 {
		return tick.Format("15:04:05")
	}
	return tick.Format("15:04:05.000")
}
