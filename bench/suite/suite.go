// Package suite is pgxlock's benchmark suite: the library against the same
// SQL written by hand with pgx and against peer lock libraries, run
// interleaved in one process. See BENCHMARKS.md at the repository root for
// the workloads, the command and a reading of the results.
package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/bench/internal/services"
)

// Config configures a run.
type Config struct {
	// Quick shrinks every duration for a smoke run (well under a minute).
	Quick bool
	// Out is the directory results.json and results.md are written to.
	// Empty: nothing is written.
	Out string
	// Poll is the retry interval of the polling peers. Zero: 5 ms.
	Poll time.Duration
	// Only, when non-empty, selects workloads: each entry is a section
	// ("uncontended", "contention", "fairness", "unrelated", "scaling", "held"), optionally
	// followed by ":" and a substring of a group or configuration name.
	Only []string
	// NoPeers skips Redis and etcd (no servers are looked for or started).
	NoPeers bool
	// Log receives progress lines. Nil: silent.
	Log io.Writer
	// Command is recorded in the results as the command that ran them.
	Command string
}

type params struct {
	warmOps, countOps int
	ucRounds          int
	ucSlice           time.Duration
	ctRounds          int
	ctSlice           time.Duration
	fairSlices        int
	fairSlice         time.Duration
	urRounds          int
	urSlice           time.Duration
	grace             time.Duration
	// scaling: processes, keys, pinned connections
	spRounds, skRounds, pnRounds int
	spSlice, skSlice, pnSlice    time.Duration
}

var (
	fullParams = params{warmOps: 50, countOps: 300, ucRounds: 16, ucSlice: 200 * time.Millisecond,
		ctRounds: 4, ctSlice: 500 * time.Millisecond, fairSlices: 5, fairSlice: 2 * time.Second,
		urRounds: 10, urSlice: 300 * time.Millisecond, grace: 1500 * time.Millisecond,
		spRounds: 2, spSlice: 500 * time.Millisecond, skRounds: 3, skSlice: 300 * time.Millisecond, pnRounds: 4, pnSlice: 300 * time.Millisecond}
	quickParams = params{warmOps: 10, countOps: 30, ucRounds: 3, ucSlice: 20 * time.Millisecond,
		ctRounds: 1, ctSlice: 100 * time.Millisecond, fairSlices: 2, fairSlice: 200 * time.Millisecond,
		urRounds: 1, urSlice: 300 * time.Millisecond, grace: 300 * time.Millisecond,
		spRounds: 1, spSlice: 150 * time.Millisecond, skRounds: 1, skSlice: 30 * time.Millisecond, pnRounds: 1, pnSlice: 100 * time.Millisecond}
)

// Suite is one run.
type Suite struct {
	cfg    Config
	params params
	env    Env
	res    *Results
	log    io.Writer
	// throwaway: the database is a cluster the suite started (its lock
	// table is ours to fill).
	throwaway bool
}

// Results is everything a run measured; it is what results.json holds.
type Results struct {
	Meta        Meta                 `json:"meta"`
	Uncontended []*UncontendedResult `json:"uncontended"`
	Contention  []*ContentionResult  `json:"contention"`
	Unrelated   []*UnrelatedResult   `json:"unrelated"`
	Scaling     *ScalingResults      `json:"scaling,omitempty"`
	Held        *HeldResults         `json:"held,omitempty"`
	Targets     []Target             `json:"targets"`
}

// Meta describes the machine, the versions and the settings of a run.
type Meta struct {
	Started     time.Time         `json:"started"`
	Finished    time.Time         `json:"finished"`
	Command     string            `json:"command"`
	Quick       bool              `json:"quick"`
	NumCPU      int               `json:"num_cpu"`
	MemTotal    string            `json:"mem_total"`
	CPUModel    string            `json:"cpu_model"`
	Kernel      string            `json:"kernel"`
	GoVersion   string            `json:"go_version"`
	Postgres    string            `json:"postgres"`
	PGSettings  string            `json:"postgres_settings"`
	Redis       string            `json:"redis"`
	Etcd        string            `json:"etcd"`
	Modules     map[string]string `json:"modules"`
	Unavailable map[string]string `json:"unavailable"`
	Poll        string            `json:"poll_interval"`
	Params      map[string]string `json:"params"`
	Library     string            `json:"library"` // the repository's commit (bench builds the library from ../)
	LoadBefore  string            `json:"loadavg_before"`
	LoadAfter   string            `json:"loadavg_after"`
}

// Run runs the suite: it finds or starts the database, Redis and etcd, runs
// the selected workloads, writes the results and stops what it started.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	s := newSuite(cfg)
	stop, err := s.start(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	s.res.Meta.LoadBefore = loadAvg()
	for _, step := range []func(context.Context) error{s.runUncontended, s.runContention, s.runFairness, s.runUnrelated, s.runScaling, s.runHeld} {
		if err := step(ctx); err != nil {
			return s.res, err
		}
		if err := ctx.Err(); err != nil {
			return s.res, err
		}
	}
	s.res.Meta.Finished = time.Now().UTC()
	s.res.Meta.LoadAfter = loadAvg()
	s.res.Targets = evaluateTargets(s.res)
	return s.res, s.save()
}

func newSuite(cfg Config) *Suite {
	if cfg.Poll == 0 {
		cfg.Poll = 5 * time.Millisecond
	}
	s := &Suite{cfg: cfg, params: fullParams, log: cfg.Log, res: &Results{}}
	if cfg.Quick {
		s.params = quickParams
	}
	if s.log == nil {
		s.log = io.Discard
	}
	s.res.Meta = Meta{Started: time.Now().UTC(), Command: cfg.Command, Quick: cfg.Quick, Poll: cfg.Poll.String(),
		Unavailable: map[string]string{}, Params: s.params.describe()}
	s.env = Env{Poll: cfg.Poll, Schema: "pgxlockbench", Unavailable: s.res.Meta.Unavailable,
		RunID: fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)}
	// Advisory keys are database-wide: start this run's keys at a random
	// high base, so that two runs (or anything else) do not collide.
	s.env.KeyBase = 7_000_000_000 + (time.Now().UnixNano()%1000)*1_000_000
	return s
}

// start finds or starts the services, records the versions and prepares
// the bench schema. stop stops what it started.
func (s *Suite) start(ctx context.Context) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	pg, err := services.StartPostgres(ctx)
	if err != nil {
		return nil, err
	}
	stops = append(stops, pg.Stop)
	s.env.DSN = pg.DSN
	s.throwaway = pg.Throwaway
	if pg.Throwaway {
		s.logf("throwaway PostgreSQL cluster from %s", pg.BinDir)
		s.res.Meta.PGSettings = "throwaway cluster: " + strings.Join(services.ThrowawaySettings, ", ")
	} else {
		s.res.Meta.PGSettings = "DATABASE_URL"
	}
	if !s.cfg.NoPeers {
		if r, err := services.StartRedis(); err != nil {
			s.res.Meta.Unavailable["redis"] = err.Error()
			s.logf("Redis unavailable: %v", err)
		} else {
			stops = append(stops, r.Stop)
			s.env.RedisAddr = r.Addr
			s.res.Meta.Redis = r.Version
			if r.Started {
				s.res.Meta.Redis += " (started by the suite)"
			}
		}
		if e, err := services.StartEtcd(); err != nil {
			s.res.Meta.Unavailable["etcd"] = err.Error()
			s.logf("etcd unavailable: %v", err)
		} else {
			stops = append(stops, e.Stop)
			s.env.EtcdEndpoint = e.Endpoint
			s.res.Meta.Etcd = e.Version + " (data dir " + filepath.Dir(e.DataDir) + ")"
		}
	} else {
		s.res.Meta.Unavailable["redis"] = "skipped (NoPeers)"
		s.res.Meta.Unavailable["etcd"] = "skipped (NoPeers)"
	}
	if err := s.prepare(ctx); err != nil {
		return nil, err
	}
	return stop, nil
}

func (p params) describe() map[string]string {
	return map[string]string{
		"uncontended": fmt.Sprintf("%d rounds x %v slice per contender, %d counted calls", p.ucRounds, p.ucSlice, p.countOps),
		"contention":  fmt.Sprintf("%d rounds x %v slice per contender and configuration", p.ctRounds, p.ctSlice),
		"fairness":    fmt.Sprintf("%d slices x %v per contender", p.fairSlices, p.fairSlice),
		"unrelated":   fmt.Sprintf("%d rounds x %v slice per scenario", p.urRounds, p.urSlice),
		"stop_grace":  p.grace.String(),
		"scaling": fmt.Sprintf("processes %d rounds x %v slice; keys %d rounds x %v; pinned %d rounds x %v",
			p.spRounds, p.spSlice, p.skRounds, p.skSlice, p.pnRounds, p.pnSlice),
	}
}

// prepare records the versions and creates the bench schema.
func (s *Suite) prepare(ctx context.Context) error {
	m := &s.res.Meta
	m.NumCPU = runtime.NumCPU()
	m.GoVersion = runtime.Version()
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Library = libraryCommit()
	m.Modules = map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			for _, want := range []string{"github.com/jackc/pgx/v5", "github.com/pressly/goose/v3", "github.com/bsm/redislock",
				"github.com/go-redsync/redsync/v4", "go.etcd.io/etcd/client/v3", "github.com/redis/go-redis/v9"} {
				if d.Path == want {
					m.Modules[want] = d.Version
				}
			}
		}
	}
	conn, err := pgx.Connect(ctx, s.env.DSN)
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var maxConns int
	if err := conn.QueryRow(ctx, "SELECT version(), current_setting('max_connections')::int").Scan(&m.Postgres, &maxConns); err != nil {
		return err
	}
	if maxConns < 250 {
		s.logf("warning: max_connections is %d; the contention matrix opens up to 4 pools of 50 at once (250 recommended)", maxConns)
	}
	pool, closePool, err := newPool(ctx, &s.env, Spec{PoolSize: 2})
	if err != nil {
		return err
	}
	defer closePool()
	return prepareLeases(ctx, &s.env, pool)
}

// libraryCommit describes the library the suite was built with: bench
// replaces the module with the repository root, so it is the working tree.
func libraryCommit() string {
	out, err := exec.Command("git", "-C", "..", "log", "-1", "--format=%h %cI %s").Output()
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--", "advisory", "lease", "keys", "pooltx").Output(); err == nil && len(st) > 0 {
		s += " (with uncommitted library changes)"
	}
	return s
}

// loadAvg is /proc/loadavg's first three fields: other work on the machine
// during a run shows up here.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func procField(path, name string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// want reports whether the workload named name of section is selected.
func (s *Suite) want(section, name string) bool {
	if len(s.cfg.Only) == 0 {
		return true
	}
	for _, o := range s.cfg.Only {
		sec, sub, _ := strings.Cut(o, ":")
		if sec == section && (sub == "" || strings.Contains(strings.ToLower(name), strings.ToLower(sub))) {
			return true
		}
	}
	return false
}

func (s *Suite) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// save writes results.json and results.md (after every workload, so an
// interrupted run keeps what it measured).
func (s *Suite) save() error {
	if s.cfg.Out == "" {
		return nil
	}
	if err := os.MkdirAll(s.cfg.Out, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s.res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.cfg.Out, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.cfg.Out, "results.md"), []byte(Markdown(s.res)), 0o644)
}
