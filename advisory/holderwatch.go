package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// watch runs while hc holds locks. Between statements it holds the turn
// and parks in a read on the idle connection (WaitForNotification), which
// returns at once when the server ends the session or the socket closes;
// a caller that wants the turn cuts the read short. When c has not
// answered for HeartbeatInterval (statements count), a ping bounded by
// HeartbeatTimeout checks that the server still answers.
func (hc *holderConn) watch() {
	defer hc.watchDone.Done()
	// The channels are made here, not with hc: a holder connection that
	// holds for less than watchDelay never needs them.
	hc.mu.Lock()
	if hc.stopping {
		hc.mu.Unlock()
		return
	}
	hc.idle, hc.stop = make(chan struct{}, 1), make(chan struct{})
	hc.mu.Unlock()
	pg := hc.c.Conn().PgConn()
	nc := pg.Conn()
	interval, timeout := hc.l.cfg.HeartbeatInterval, hc.l.cfg.HeartbeatTimeout
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	defer quiet.Stop()
	for {
		// Wait until no caller wants the connection, then for the turn.
		hc.mu.Lock()
		for hc.inUse > 0 {
			hc.mu.Unlock()
			select {
			case <-hc.idle:
			case <-hc.stop:
				return
			}
			hc.mu.Lock()
		}
		hc.mu.Unlock()
		select {
		case hc.turn <- struct{}{}:
		case <-hc.stop:
			return
		}
		select {
		case <-hc.stop:
			hc.turn.unlock()
			return
		default:
		}
		hc.mu.Lock()
		if hc.inUse > 0 {
			hc.mu.Unlock()
			hc.turn.unlock()
			continue
		}
		if d := watchDelay - time.Since(hc.lastOK); d > 0 {
			// The connection has just answered a statement: while calls come
			// and go, each one's statement would find a dead connection
			// anyway, and a read parked now would be cut short by the next
			// one (a wake-up of this goroutine on its path). Park once the
			// connection has been quiet for watchDelay.
			hc.mu.Unlock()
			hc.turn.unlock()
			quiet.Reset(d)
			select {
			case <-quiet.C:
			case <-hc.stop:
				return
			}
			continue
		}
		var deadline time.Time
		if interval > 0 {
			deadline = hc.lastOK.Add(interval)
		}
		var err error
		if deadline.IsZero() || time.Now().Before(deadline) {
			hc.parked = true
			_ = nc.SetReadDeadline(deadline)
			hc.mu.Unlock()
			err = waitNotification(pg)
			hc.mu.Lock()
			hc.parked = false
			_ = nc.SetReadDeadline(time.Time{})
		} else {
			err = errHeartbeatDue
		}
		hc.mu.Unlock()

		switch {
		case err == nil: // a notification: nobody LISTENs here; go on
		case (isTimeout(err) || err == errHeartbeatDue) && !pg.IsClosed():
			if interval <= 0 || time.Now().Before(deadline) {
				break // cut short by a caller: let it have the turn
			}
			pctx, cancel := context.WithTimeout(&hc.watchCtx, timeout)
			perr := pingGuarded(pctx, pg)
			cancel()
			if perr != nil {
				hc.lose(perr, nil, true)
				hc.turn.unlock()
				return
			}
			hc.lastOK = time.Now()
		default:
			hc.lose(err, nil, true)
			hc.turn.unlock()
			return
		}
		hc.turn.unlock()
	}
}

var errHeartbeatDue = errors.New("advisory: heartbeat due")

// waitNotification parks a watcher in a read on pg (context.Background: no
// pgx context watcher, which could send cancel requests; the read deadline
// is the only timer). The watcher's goroutine is the library's: a panic of
// the pool's OnNotice or OnNotification handler there, which no caller
// could recover, would end the process, so it becomes the read's error and
// the connection is lost.
func waitNotification(pg *pgconn.PgConn) (err error) {
	defer recoverHandler(&err)
	return pg.WaitForNotification(context.Background())
}

// pingGuarded is pg.Ping on a watcher's goroutine, a handler's panic
// recovered as in waitNotification.
func pingGuarded(ctx context.Context, pg *pgconn.PgConn) (err error) {
	defer recoverHandler(&err)
	return pg.Ping(ctx)
}

func recoverHandler(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if e, ok := r.(error); ok { // kept for errors.Is and errors.As
		*err = fmt.Errorf("advisory: a handler of the pool's connection panicked while the watcher read: %w", e)
		return
	}
	*err = fmt.Errorf("advisory: a handler of the pool's connection panicked while the watcher read: %v", r)
}
