package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
	"github.com/pgxlock/pgxlock/internal/tcpproxy"
)

// database is the server(s) of a run: a throwaway cluster (and standby) it started, or
// a server it was given.
type database struct {
	dsn     string
	targets [][2]string // network, address of each server, primary first
	primary *pglaunch.Cluster
	standby *pglaunch.Cluster // with -standby; a failover replaces it
	servers []server          // the proxies of targets, in the same order
	// primarySlot is the index in servers of the primary (with a standby).
	primarySlot int
	restart     func(context.Context) error // nil without a cluster of our own
	failover    func(context.Context) error // nil without a standby
	stops       []func()
}

// startDB starts the throwaway cluster(s), or parses -dsn.
func startDB(ctx context.Context, cfg config, out io.Writer) (*database, error) {
	db := &database{}
	if cfg.DSN != "" {
		pc, err := pgconn.ParseConfig(cfg.DSN)
		if err != nil {
			return nil, fmt.Errorf("-dsn: %w", err)
		}
		network, addr := "tcp", net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))
		if strings.HasPrefix(pc.Host, "/") {
			network, addr = "unix", filepath.Join(pc.Host, ".s.PGSQL."+strconv.Itoa(int(pc.Port)))
		}
		db.dsn, db.targets = cfg.DSN, [][2]string{{network, addr}}
		return db, nil
	}
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := pglaunch.Start(sctx, pglaunch.Options{})
	if err != nil {
		return nil, err
	}
	db.stops = append(db.stops, func() { stopCluster(c) })
	db.primary, db.dsn = c, c.DSN()
	db.targets = [][2]string{{"tcp", "127.0.0.1:" + strconv.Itoa(c.Port())}}
	db.restart = func(ctx context.Context) error { return db.primary.Restart(ctx) }
	fmt.Fprintf(out, "soak: throwaway cluster on port %d started in %v\n", c.Port(), time.Since(t0).Round(time.Millisecond))
	if cfg.Standby {
		if err := db.startStandby(sctx, out); err != nil {
			db.stop()
			return nil, err
		}
	}
	return db, nil
}

func stopCluster(c *pglaunch.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = c.Stop(ctx) // idempotent; a failure leaves an orphan the next pglaunch.Start reaps
}

// proxies starts the two proxies of every server.
func (db *database) proxies() ([]server, error) {
	var out []server
	for _, t := range db.targets {
		lock, err := tcpproxy.New(t[0], t[1])
		if err != nil {
			closeServers(out)
			return nil, err
		}
		obs, err := tcpproxy.New(t[0], t[1])
		if err != nil {
			lock.Close()
			closeServers(out)
			return nil, err
		}
		out = append(out, server{lock: lock, obs: obs})
	}
	db.servers = out
	return out, nil
}

// stop stops every cluster the run started, newest first.
func (db *database) stop() {
	for i := len(db.stops) - 1; i >= 0; i-- {
		db.stops[i]()
	}
}

func closeServers(srv []server) {
	for _, s := range srv {
		s.lock.Close()
		s.obs.Close()
	}
}
