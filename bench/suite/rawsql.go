package suite

// Hand-written copies of the lease statements, for the raw pgx contenders:
// the same SQL the library sends, run by hand. Copied from lease/manager_sql.go
// and lease/column.go; placeholders as there ({holders}, {resources}, {t}, ...).
const (
	rawLockResourceSQL = `
INSERT INTO {resources} AS r (resource) VALUES ($1)
ON CONFLICT (resource) DO UPDATE SET fence = r.fence WHERE false`

	rawAcquireSQL = `
WITH expired AS (
	DELETE FROM {holders}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {holders}
		WHERE resource = $1 AND expires_at <= now()
		ORDER BY token
		FOR UPDATE))
	RETURNING token
),
blockers AS (
	SELECT b.expires_at AS until FROM {holders} b
	WHERE b.resource = $1
	  AND b.token NOT IN (SELECT token FROM expired)
	  AND ($2::text = 'exclusive' OR b.mode = 'exclusive')
	UNION ALL
	SELECT r.writer_intent_until FROM {resources} r
	WHERE r.resource = $1 AND $2::text = 'shared' AND r.writer_intent_until > now()
),
granted AS (
	UPDATE {resources} r SET
		fence = r.fence + 1,
		writer_intent = CASE WHEN r.writer_intent = $7::text THEN NULL ELSE r.writer_intent END,
		writer_intent_until = CASE WHEN r.writer_intent = $7::text THEN NULL ELSE r.writer_intent_until END
	WHERE r.resource = $1 AND NOT EXISTS (SELECT 1 FROM blockers)
	RETURNING r.fence
),
waiting AS (
	UPDATE {resources} r SET writer_intent = $7::text, writer_intent_until = now() + $8::interval
	WHERE r.resource = $1 AND $7::text IS NOT NULL AND EXISTS (SELECT 1 FROM blockers)
),
inserted AS (
	INSERT INTO {holders} (resource, token, lease_id, owner, mode, acquired_at, expires_at, metadata)
	SELECT $1, g.fence, $3, $4, $2::text, now(), now() + $5::interval, $6::jsonb FROM granted g
	RETURNING token, acquired_at, expires_at
)
SELECT i.token, i.acquired_at, i.expires_at,
	(SELECT extract(epoch FROM min(until) - now())::float8 FROM blockers)
FROM (VALUES (1)) AS one (x) LEFT JOIN inserted i ON true`

	rawReleaseSQL = `
WITH released AS (
	DELETE FROM {holders} WHERE resource = $1 AND token = $2 AND lease_id = $3
	RETURNING resource
)
SELECT count(*) FROM released, LATERAL pg_notify($4, md5(released.resource))`

	rawColumnAcquireSQL = `
WITH claimed AS (
	UPDATE {t} SET {at} = now(), {by} = $2, {fence} = coalesce({fence}, 0) + 1
	WHERE {id} = $1 AND ({at} IS NULL OR {at} < now() - $3::interval)
	RETURNING {fence} AS token
)
SELECT (SELECT token FROM claimed), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1)`

	rawColumnReleaseSQL = `
WITH released AS (
	UPDATE {t} SET {at} = NULL, {by} = NULL
	WHERE {id} = $1 AND {by} = $2
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM released), EXISTS (SELECT 1 FROM {t} WHERE {id} = $1)`
)
