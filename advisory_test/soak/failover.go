package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/pgxlock/pgxlock/internal/pglaunch"
)

// startStandby starts a streaming standby of db.primary and makes failover available:
// stop the primary (immediate: its sessions die, so no client can keep a lock there),
// promote the standby, build a new standby from it, and point the proxies of the old
// primary's slot at the new standby. Clients find the new primary through their
// multi-host configuration (target_session_attrs=read-write).
func (db *database) startStandby(ctx context.Context, out io.Writer) error {
	t0 := time.Now()
	sb, err := db.primary.StartStandby(ctx, pglaunch.StandbyOptions{})
	if err != nil {
		return err
	}
	db.stops = append(db.stops, func() { stopCluster(sb) })
	db.standby = sb
	db.primarySlot = 0
	db.targets = append(db.targets, [2]string{"tcp", "127.0.0.1:" + strconv.Itoa(sb.Port())})
	db.failover = db.doFailover
	fmt.Fprintf(out, "soak: streaming standby on port %d started in %v\n", sb.Port(), time.Since(t0).Round(time.Millisecond))
	return nil
}

func (db *database) doFailover(ctx context.Context) error {
	old, promoted := db.primary, db.standby
	stopCluster(old)
	if err := promoted.Promote(ctx); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	db.primary, db.standby = promoted, nil
	sb, err := promoted.StartStandby(ctx, pglaunch.StandbyOptions{})
	if err != nil {
		return fmt.Errorf("new standby: %w", err)
	}
	db.stops = append(db.stops, func() { stopCluster(sb) })
	db.standby = sb
	addr := "127.0.0.1:" + strconv.Itoa(sb.Port())
	s := db.servers[db.primarySlot] // the old primary's slot
	s.lock.SetTarget("tcp", addr)
	s.obs.SetTarget("tcp", addr)
	db.primarySlot = 1 - db.primarySlot
	return nil
}
