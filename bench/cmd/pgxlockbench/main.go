// Command pgxlockbench runs pgxlock's benchmark suite: the library against
// raw pgx and peer lock libraries, interleaved in one process. It writes
// results.json and results.md to -out.
//
//	cd bench && go run ./cmd/pgxlockbench -out results/full
//	cd bench && go run ./cmd/pgxlockbench -quick -out results/quick
//
// The database is DATABASE_URL's, or a throwaway cluster started from the
// local PostgreSQL binaries; Redis is REDIS_ADDR's (default 127.0.0.1:6379)
// or a redis-server it starts; etcd is started on loopback when the etcd
// binary is installed (bench/run.sh installs Debian's etcd-server). A peer
// whose server is missing is reported unavailable and the run goes on.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pgxlock/pgxlock/bench/suite"
)

func main() {
	suite.ChildMain() // the scaling section re-execs this binary as its replicas
	var (
		quick   = flag.Bool("quick", false, "shrink every duration for a smoke run (< 60 s)")
		out     = flag.String("out", "", "directory for results.json and results.md (default results/<UTC time>)")
		poll    = flag.Duration("poll", 5*time.Millisecond, "retry interval of the polling peers")
		only    = flag.String("only", "", "comma-separated sections to run: uncontended, contention, fairness, unrelated, scaling, held (section:substring selects by name)")
		noPeers = flag.Bool("no-peers", false, "skip Redis and etcd")
	)
	flag.Parse()
	if *out == "" {
		*out = "results/" + time.Now().UTC().Format("20060102T150405Z")
	}
	cfg := suite.Config{Quick: *quick, Out: *out, Poll: *poll, NoPeers: *noPeers, Log: os.Stderr,
		Command: "cd bench && go run ./cmd/pgxlockbench " + strings.Join(os.Args[1:], " ")}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	res, err := suite.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgxlockbench:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "done in %v; results in %s\n", time.Since(t0).Round(time.Second), *out)
	for _, t := range res.Targets {
		fmt.Fprintf(os.Stderr, "  %-4s %s: %s (want %s)\n", t.Met, t.Name, t.Got, t.Want)
	}
}
