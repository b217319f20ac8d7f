package lease

import "strings"

// The lock-manager statements. Placeholders: {holders} and {resources} are the
// quoted, qualified table names; {next_fence} is the next token
// (nextTokenSQL). newManagerSQL substitutes them all in one pass. Values are always bind parameters; the
// channel name travels as a value to pg_notify, and the payload is
// md5(resource) (see wakeKey).
//
// Concurrency contract, relied on by the comments below:
//   - Every acquisition of a resource first locks that resource's row in
//     {resources} (lockResource), so decisions about one resource are taken
//     one at a time, each on a snapshot that sees every earlier decision.
//   - Renew, Release, ReleaseAll and Sweep never take that lock. They only
//     shrink or extend existing holder rows, and the acquisition statement
//     is written so that racing with them is safe (see acquire).
//   - Statements that delete several holder rows lock them in (resource,
//     token) order, and Sweep skips locked rows, so they cannot deadlock
//     with each other or with an acquisition.
type managerSQL struct {
	lockResource, acquire, renew, release, giveBack           string
	releaseAllLock, releaseAll, sweep, list, intents, upgrade string
	schema, upToDate                                          string
	upToDateArgs                                              []any
}

// upgradedSuffix is appended to a lease id by TryUpgrade: an exclusive row
// whose lease id ends in it is a shared lease its own TryUpgrade turned
// exclusive. Lease ids this package issues are UUIDs, so no acquisition's
// id has it.
const upgradedSuffix = "/upgraded"

// matchUpgraded is the match (renew's and release's $5) of a shared lease
// its own TryUpgrade turned exclusive.
const matchUpgraded = "upgraded"

// ownRowSQL is how Renew and Release find the caller's row among the
// resource's holders (with resource = $1 AND token = $2), from $3, the
// lease id, and $5, what the caller believes it holds: 'exclusive' or
// 'shared' (a row of that mode with lease id $3), 'upgraded' (an exclusive
// row with lease id $3 || upgradedSuffix: a shared lease its own TryUpgrade
// turned exclusive) or NULL (either of the two rows a shared lease's
// TryUpgrade in flight, or of unknown outcome, may have left). An exclusive
// row that no upgrade of lease $3 wrote is never matched by a caller that
// believes it holds Shared, however its upgrade went.
const ownRowSQL = `(CASE WHEN $5::pg_catalog.text IS NULL THEN (lease_id = $3 AND mode = 'shared')
		OR (lease_id = $3 OPERATOR(pg_catalog.||) '` + upgradedSuffix + `' AND mode = 'exclusive')
	WHEN $5::pg_catalog.text = '` + matchUpgraded + `' THEN lease_id = $3 OPERATOR(pg_catalog.||) '` + upgradedSuffix + `' AND mode = 'exclusive'
	ELSE lease_id = $3 AND mode = $5::pg_catalog.text END)`

func newManagerSQL(r0 *strings.Replacer) managerSQL {
	r := commentFree{r0}
	return managerSQL{
		lockResource:   r.Replace(lockResourceSQL),
		acquire:        r.Replace(acquireSQL),
		renew:          r.Replace(renewSQL),
		release:        r.Replace(releaseSQL),
		giveBack:       r.Replace(giveBackSQL),
		releaseAllLock: r.Replace(releaseAllLockSQL),
		releaseAll:     r.Replace(releaseAllSQL),
		sweep:          r.Replace(sweepSQL),
		list:           r.Replace(listSQL),
		intents:        r.Replace(intentsSQL),
		upgrade:        r.Replace(upgradeSQL),
		schema:         r.Replace(managerSchemaSQL),
	}
}

// commentFree substitutes placeholders into a statement template only after
// removing the template's -- comments, so that no substituted name can land
// inside a comment (where a line break in it would end the comment and
// turn the rest of the name into SQL).
type commentFree struct{ r *strings.Replacer }

func (c commentFree) Replace(sql string) string { return c.r.Replace(stripComments(sql)) }

// stripComments removes every -- comment (up to, not including, the line
// break) from a statement template of this package. It knows single- and
// double-quoted text, the only quoting the templates use, and leaves
// everything else as it is.
func stripComments(sql string) string {
	var b strings.Builder
	b.Grow(len(sql))
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'' || c == '"':
			j := strings.IndexByte(sql[i+1:], c)
			if j < 0 {
				b.WriteString(sql[i:])
				return b.String()
			}
			b.WriteString(sql[i : i+j+2])
			i += j + 1
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexAny(sql[i:], "\r\n")
			if j < 0 {
				return b.String()
			}
			i += j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

const (
	// Creates the resource's row on first use and locks it FOR UPDATE in
	// every case: ON CONFLICT DO UPDATE locks the conflicting row even when
	// its WHERE is false, and WHERE false writes no new row version.
	lockResourceSQL = `
INSERT INTO {resources} AS r (resource) VALUES ($1)
ON CONFLICT (resource) DO UPDATE SET fence = r.fence WHERE false`

	// The decision. $1 resource, $2 mode, $3 lease_id, $4 owner, $5 ttl,
	// $6 metadata, $7 writer intent id (NULL: none), $8 intent lifetime.
	//
	// expired: deletes the resource's expired holders. The FOR UPDATE
	// sub-select re-checks expires_at against the latest committed version of
	// each row, so a holder that renewed concurrently is not deleted.
	//
	// blockers: every holder row this statement did NOT delete counts, even
	// one whose snapshot version looks expired. That is what makes a racing
	// Renew safe without the resource lock: either the renewal committed
	// first (the row survives the delete and blocks us) or we deleted the row
	// first (the renewal then finds nothing and reports ErrLeaseLost). A
	// Release racing with us makes us see a holder that is already gone:
	// harmless, its NOTIFY wakes us for another attempt. For a shared
	// request, a live writer intent also blocks (writer preference).
	//
	// granted / waiting: exactly one of them updates the resource row. A
	// grant bumps the fence (the new value is the token: nextTokenSQL) and
	// clears the intent if it is ours, or any intent for an exclusive grant: the
	// writers still waiting are shut out by this holder anyway. A blocked
	// writer that waits stores its intent only while readers alone block it
	// (writer preference), and withdraws it while a writer holds: so when a
	// writer leaves, no intent is left over from its tenure, and the readers
	// that waited through it compete for the next turn on equal terms with
	// the next writer instead of being refused by its intent (readers would
	// otherwise starve under a stream of writers).
	//
	// The final row always exists: token is NULL when not granted, and
	// retry_after is the seconds until the earliest blocker expires.
	acquireSQL = `
WITH expired AS (
	DELETE FROM {holders}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {holders}
		WHERE resource = $1 AND expires_at <= pg_catalog.now()
		ORDER BY token
		FOR UPDATE))
	RETURNING token
),
blockers AS (
	SELECT b.expires_at AS until, b.mode AS kind FROM {holders} b
	WHERE b.resource = $1
	  AND b.token NOT IN (SELECT token FROM expired)
	  AND ($2::pg_catalog.text = 'exclusive' OR b.mode = 'exclusive')
	UNION ALL
	SELECT r.writer_intent_until, 'intent' FROM {resources} r
	WHERE r.resource = $1 AND $2::pg_catalog.text = 'shared' AND r.writer_intent_until > pg_catalog.now()
),
granted AS (
	UPDATE {resources} r SET
		fence = {next_fence},
		writer_intent = CASE WHEN $2::pg_catalog.text = 'exclusive' OR r.writer_intent = $7::pg_catalog.text THEN NULL ELSE r.writer_intent END,
		writer_intent_until = CASE WHEN $2::pg_catalog.text = 'exclusive' OR r.writer_intent = $7::pg_catalog.text THEN NULL ELSE r.writer_intent_until END
	WHERE r.resource = $1 AND NOT EXISTS (SELECT 1 FROM blockers)
	RETURNING r.fence
),
waiting AS (
	UPDATE {resources} r SET
		writer_intent = CASE WHEN w.by_writer THEN NULL ELSE $7::pg_catalog.text END,
		writer_intent_until = CASE WHEN w.by_writer THEN NULL ELSE pg_catalog.now() + $8::interval END
	FROM (SELECT pg_catalog.bool_or(kind = 'exclusive') AS by_writer FROM blockers) w
	WHERE r.resource = $1 AND $7::pg_catalog.text IS NOT NULL AND EXISTS (SELECT 1 FROM blockers)
	  AND (NOT w.by_writer OR r.writer_intent = $7::pg_catalog.text)
),
inserted AS (
	INSERT INTO {holders} (resource, token, lease_id, owner, mode, acquired_at, expires_at, metadata)
	SELECT $1, g.fence, $3, $4, $2::pg_catalog.text, pg_catalog.now(), pg_catalog.now() + $5::interval, $6::pg_catalog.jsonb FROM granted g
	RETURNING token, acquired_at, expires_at
)
SELECT i.token, i.acquired_at, i.expires_at,
	(SELECT CASE WHEN pg_catalog.isfinite(pg_catalog.min(until)) THEN extract(epoch FROM pg_catalog.min(until) - pg_catalog.now())::pg_catalog.float8 END FROM blockers)
FROM (VALUES (1)) AS one (x) LEFT JOIN inserted i ON true`

	// Extends a live lease only. An expired one cannot be revived: someone
	// may already have judged it expired and acted (see acquire).
	// $5 is what the caller believes it holds (see ownRowSQL): a Ref edited
	// to claim another mode matches nothing. It returns the mode found.
	renewSQL = `
UPDATE {holders} SET expires_at = pg_catalog.now() + $4::interval
WHERE resource = $1 AND token = $2 AND ` + ownRowSQL + ` AND expires_at > pg_catalog.now()
RETURNING expires_at, mode`

	// Deletes the lease if it is still this acquisition's, expired or not,
	// and wakes waiters. Returns the number of rows deleted (0 or 1). $5 is
	// what the caller believes it holds, as for renew (ownRowSQL).
	releaseSQL = `
WITH released AS (
	DELETE FROM {holders} WHERE resource = $1 AND token = $2 AND ` + ownRowSQL + `
	RETURNING resource
)
SELECT pg_catalog.count(*) FROM released, LATERAL pg_catalog.pg_notify($4, pg_catalog.md5(pg_catalog.convert_to(released.resource, 'UTF8')))`

	// Undoes whatever an attempt with an unknown outcome, or an abandoned
	// wait, may have left: its lease row (by lease_id, unique to the call)
	// and its writer intent. Wakes waiters for what it removed.
	giveBackSQL = `
WITH gone AS (
	DELETE FROM {holders} WHERE resource = $1 AND lease_id = $2
	RETURNING resource
),
cleared AS (
	UPDATE {resources} SET writer_intent = NULL, writer_intent_until = NULL
	WHERE resource = $1 AND writer_intent = $3::pg_catalog.text
	RETURNING resource
)
SELECT pg_catalog.count(*) FROM (SELECT resource FROM gone UNION ALL SELECT resource FROM cleared) x,
	LATERAL pg_catalog.pg_notify($4, pg_catalog.md5(pg_catalog.convert_to(x.resource, 'UTF8')))`

	// ReleaseAll is two statements of one transaction: the first locks the
	// owner's rows in (resource, token) order, as every statement that locks
	// several rows does; the second, whose snapshot is taken after those
	// locks, deletes them. One statement that deleted by the ctids its
	// sub-select had locked missed a row whose renewal committed meanwhile:
	// the lock follows the row to its new version, which the DELETE's older
	// snapshot cannot see. Notifications with the same channel and payload
	// in one transaction are delivered once, so notifying per row is cheap.
	releaseAllLockSQL = `
SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {holders} WHERE owner = $1 ORDER BY resource, token FOR UPDATE) l`
	releaseAllSQL = `
WITH released AS (
	DELETE FROM {holders} WHERE owner = $1
	RETURNING resource
)
SELECT pg_catalog.count(*) FROM released, LATERAL pg_catalog.pg_notify($2, pg_catalog.md5(pg_catalog.convert_to(released.resource, 'UTF8')))`

	// SKIP LOCKED: a row being renewed, released or judged by an acquirer
	// right now is left to them.
	sweepSQL = `
WITH swept AS (
	DELETE FROM {holders}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {holders} WHERE expires_at <= pg_catalog.now()
		ORDER BY resource, token
		FOR UPDATE SKIP LOCKED))
	RETURNING resource
)
SELECT pg_catalog.count(*) FROM swept, LATERAL pg_catalog.pg_notify($1, pg_catalog.md5(pg_catalog.convert_to(swept.resource, 'UTF8')))`

	// List and ListIntents run outside the frame (see exec), and a
	// timestamp read as text (pgx's Exec and simple protocol modes) is
	// parsed in the ISO DateStyle only: their times travel as microseconds
	// since the Unix epoch, exact (extract returns numeric). A time edited
	// by hand to 'infinity' or '-infinity' (extract gives numeric
	// Infinity, which int8 cannot hold), or to a finite one past the year
	// 294247 (timestamptz reaches 294276), travels as the largest or
	// smallest int8.
	listSQL = `
SELECT resource, owner, mode, token, LEAST(GREATEST(pg_catalog.extract('epoch', acquired_at) OPERATOR(pg_catalog.*) 1000000, -9223372036854775808), 9223372036854775807)::pg_catalog.int8, LEAST(GREATEST(pg_catalog.extract('epoch', expires_at) OPERATOR(pg_catalog.*) 1000000, -9223372036854775808), 9223372036854775807)::pg_catalog.int8, metadata, expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
FROM {holders}
WHERE ($1::pg_catalog.text IS NULL OR resource OPERATOR(pg_catalog.=) $1::pg_catalog.text)
  AND ($2::pg_catalog.text IS NULL OR owner OPERATOR(pg_catalog.=) $2::pg_catalog.text)
  AND ($3::pg_catalog.bool OR expires_at OPERATOR(pg_catalog.>) pg_catalog.now())
ORDER BY resource, token`

	// Writer intents: one per resource at most. $1 resource filter, $2
	// include intents past their lifetime (they block nobody).
	intentsSQL = `
SELECT resource, LEAST(GREATEST(pg_catalog.extract('epoch', writer_intent_until) OPERATOR(pg_catalog.*) 1000000, -9223372036854775808), 9223372036854775807)::pg_catalog.int8, writer_intent_until OPERATOR(pg_catalog.<=) pg_catalog.now()
FROM {resources}
WHERE writer_intent IS NOT NULL
  AND ($1::pg_catalog.text IS NULL OR resource OPERATOR(pg_catalog.=) $1::pg_catalog.text)
  AND ($2::pg_catalog.bool OR writer_intent_until OPERATOR(pg_catalog.>) pg_catalog.now())
ORDER BY resource`

	// Upgrade, after lockResource: $1 resource, $2 token, $3 lease_id, $4
	// ttl, $5 whether an earlier upgrade of this lease had an unknown outcome
	// (then a row already upgraded by this lease, exclusive with lease id
	// $3 || upgradedSuffix, is its own: success again). The upgrade writes
	// that lease id, so that an exclusive row it did not upgrade (an
	// exclusive lease's Ref edited to claim Shared) never counts as mine. Expired other holders are deleted as acquire does (FOR UPDATE
	// re-checks them against concurrent renewals); every other row left
	// blocks. The final row always exists: expires_at is NULL when refused,
	// mine says whether this lease is still a live shared holder.
	upgradeSQL = `
WITH expired AS (
	DELETE FROM {holders}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {holders}
		WHERE resource = $1 AND token <> $2 AND expires_at <= pg_catalog.now()
		ORDER BY token
		FOR UPDATE))
	RETURNING token
),
mine AS (
	SELECT 1 FROM {holders}
	WHERE resource = $1 AND token = $2 AND expires_at > pg_catalog.now()
	  AND ((lease_id = $3 AND mode = 'shared')
		OR ($5::pg_catalog.bool AND lease_id = $3 OPERATOR(pg_catalog.||) '` + upgradedSuffix + `' AND mode = 'exclusive'))
),
upgraded AS (
	UPDATE {holders} SET mode = 'exclusive', lease_id = $3 OPERATOR(pg_catalog.||) '` + upgradedSuffix + `', expires_at = pg_catalog.now() + $4::interval
	WHERE resource = $1 AND token = $2 AND EXISTS (SELECT 1 FROM mine)
	  AND NOT EXISTS (
		SELECT 1 FROM {holders} o
		WHERE o.resource = $1 AND o.token <> $2 AND o.token NOT IN (SELECT token FROM expired))
	RETURNING expires_at
)
SELECT (SELECT expires_at FROM upgraded), EXISTS (SELECT 1 FROM mine)`
)
