package pglaunch

import (
	"context"
	"time"
)

// Crash stops the server in immediate mode (pg_ctl stop -m immediate: the
// postmaster and its backends exit at once, nothing is flushed or
// checkpointed, as in a crash of the server processes) and starts it again
// on the same port and data, so that it runs crash recovery; it returns once
// the server accepts connections. Open sessions see their connections end.
// WAL the server had not yet written is lost, as in a real crash (the
// operating system does not crash, so WAL written but not fsynced
// survives). ctx bounds each pg_ctl call. It returns ErrStopped after Stop.
func (c *Cluster) Crash(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	t0 := time.Now()
	if err := c.stopServer(ctx); err != nil {
		return err
	}
	_, err := c.r.run(ctx, c.bin("pg_ctl"), "start", "-D", c.dataDir, "-l", c.logFile, "-w",
		"-t", pgctlTimeout(ctx), "-s")
	if err != nil {
		return c.withLogTail(err)
	}
	c.r.logf("crashed and restarted port %d in %v", c.port, time.Since(t0).Round(time.Millisecond))
	return nil
}
