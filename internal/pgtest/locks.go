package pgtest

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is what [AdvisoryLocks] needs: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx
// all satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// HeldLock is one advisory lock row of pg_locks, held (Granted) or awaited, with the
// backend's application_name from pg_stat_activity.
type HeldLock struct {
	PID             int32  // backend PID (0 for a prepared transaction)
	ApplicationName string // from pg_stat_activity; "" when the backend is gone
	Database        string // database name
	Granted         bool   // false: waiting for it
	Mode            string // ExclusiveLock or ShareLock
	ClassID         uint32 // pg_locks.classid
	ObjID           uint32 // pg_locks.objid
	ObjSubID        int16  // 1: one bigint key; 2: two int4 keys
}

// Key returns the lock's key as PostgreSQL's functions take it: "bigint <n>" for
// objsubid 1 (classid holds the high 32 bits, objid the low), "int4 pair (<a>, <b>)" for
// objsubid 2.
func (l HeldLock) Key() string {
	switch l.ObjSubID {
	case 1:
		return fmt.Sprintf("bigint %d", int64(uint64(l.ClassID)<<32|uint64(l.ObjID)))
	case 2:
		return fmt.Sprintf("int4 pair (%d, %d)", int32(l.ClassID), int32(l.ObjID))
	default:
		return fmt.Sprintf("unknown key space (classid %d, objid %d, objsubid %d)", l.ClassID, l.ObjID, l.ObjSubID)
	}
}

// String describes the lock for test failures.
func (l HeldLock) String() string {
	state := "granted"
	if !l.Granted {
		state = "waiting"
	}
	return fmt.Sprintf("pid %d (%q, db %s): %s %s, key %s [classid %d, objid %d, objsubid %d]",
		l.PID, l.ApplicationName, l.Database, l.Mode, state, l.Key(), l.ClassID, l.ObjID, l.ObjSubID)
}

func formatLocks(locks []HeldLock) string {
	var b strings.Builder
	for _, l := range locks {
		b.WriteString("  ")
		b.WriteString(l.String())
		b.WriteByte('\n')
	}
	return b.String()
}

const advisoryLocksSQL = `
SELECT coalesce(l.pid, 0), coalesce(a.application_name, ''), coalesce(d.datname, ''),
       l.granted, l.mode, l.classid, l.objid, l.objsubid
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_catalog.pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND ($1::text = '' OR a.application_name = $1::text)
ORDER BY l.pid, l.objsubid, l.classid, l.objid`

// AdvisoryLocks lists the advisory locks held or awaited on the server by backends whose
// application_name is appName ("" means every backend, in every database). ctx bounds the
// query.
func AdvisoryLocks(ctx context.Context, q Querier, appName string) ([]HeldLock, error) {
	rows, err := q.Query(ctx, advisoryLocksSQL, appName)
	if err != nil {
		return nil, fmt.Errorf("pgtest: query pg_locks: %w", err)
	}
	locks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HeldLock, error) {
		var l HeldLock
		err := row.Scan(&l.PID, &l.ApplicationName, &l.Database, &l.Granted, &l.Mode, &l.ClassID, &l.ObjID, &l.ObjSubID)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgtest: query pg_locks: %w", err)
	}
	return locks, nil
}
