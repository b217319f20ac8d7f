package lease

// Test-only access to the statements, so that benchmarks can run the very
// same SQL by hand and measure what the package adds around it.

func (c *Column) StatementsForTest() (acquire, renew, release string) {
	return c.acquireSQL, c.renewSQL, c.releaseSQL
}

func (m *Manager) StatementsForTest() (lockResource, acquire, renew, release string) {
	return m.q.lockResource, m.q.acquire, m.q.renew, m.q.release
}

// TokenFloorSQLForTest is tokenFloorSQL: the token floor of timeline tl.
func TokenFloorSQLForTest(tl string) string { return tokenFloorSQL(tl) }

// TimelineSQLForTest is timelineSQL: the server's current timeline.
const TimelineSQLForTest = timelineSQL

// SchemaSQLForTest is the DDL Migrate runs for m.
func (m *Manager) SchemaSQLForTest() string { return m.q.schema }
