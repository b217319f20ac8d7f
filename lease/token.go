package lease

import "strconv"

// TimelineShift is the bit position of the timeline in a fencing token: a
// server on timeline tl issues tokens of at least (tl-1) << TimelineShift.
// See "Fencing tokens" in the package documentation.
const TimelineShift = 40

// timelineSQL reads the timeline the server writes WAL on, as a bigint: the
// first 8 hex digits of the current WAL file's name. It changes at promotion
// (the new timeline reads at once, before any checkpoint), needs no
// privilege, and fails during recovery (55000), where the lease frame's
// BEGIN ... READ WRITE has already been refused (0A000).
//
// It and the two expressions below name every function and operator in
// pg_catalog: pgx prepares the statements that contain them outside the
// lease frame, under the session's search_path, where a look-alike of
// another result type (a * that returns boolean) made the preparation, so
// every acquisition, fail (review 25). bit and bigint are keywords, always
// pg_catalog's.
const timelineSQL = `('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

// tokenFloorSQL is the smallest token a server on timeline tl (an SQL bigint
// expression) issues: (tl-1) * 2^TimelineShift. A multiplication, not a
// shift: PostgreSQL's bigint << wraps silently, while * fails with 22003
// (bigint out of range), so a timeline too large for the format (2^23 + 1 and
// above) refuses to issue a token rather than issue a negative one.
func tokenFloorSQL(tl string) string {
	return "((" + tl + " OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) " + strconv.FormatInt(1<<TimelineShift, 10) + "::bigint)"
}

// nextTokenSQL is the token an acquisition issues given the counter's current
// value (an SQL bigint expression): the counter plus one, raised to the
// current timeline's floor. On timeline 1 the floor is 0, so tokens are the
// plain counter, as they were before timelines were part of them.
func nextTokenSQL(counter string) string {
	return "greatest(" + counter + " OPERATOR(pg_catalog.+) 1, " + tokenFloorSQL(timelineSQL) + ")"
}
