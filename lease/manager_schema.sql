-- The lock-manager tables. {resources}, {holders}, {owner_idx} and
-- {expiry_idx} are replaced by quoted identifiers before this runs.
-- Idempotent: Migrate may run at every start-up, from several processes at
-- once (it serialises on an advisory transaction lock).
-- Types and the CHECK's operator are named in pg_catalog: this runs under
-- the session's search_path, where a schema listed before pg_catalog could
-- hold look-alikes (bigint is a keyword, always pg_catalog.int8).

-- One row per resource ever leased. Never delete rows here while the
-- resource may be leased again: fence is the per-resource fencing counter,
-- and deleting the row restarts it at 0, so the next token would be the
-- current timeline's floor, greatest(1, (timeline - 1) << 40) (1 on a server
-- never promoted; see token.go), whatever tokens were handed out before.
CREATE TABLE IF NOT EXISTS {resources} (
	resource            pg_catalog.text        PRIMARY KEY,
	fence               bigint                 NOT NULL DEFAULT 0,
	writer_intent       pg_catalog.text,
	writer_intent_until pg_catalog.timestamptz
);

-- One row per holder: one for an exclusive lease, one per reader for a
-- shared one. The primary key is also the lookup path of every statement.
CREATE TABLE IF NOT EXISTS {holders} (
	resource    pg_catalog.text        NOT NULL,
	token       bigint                 NOT NULL,
	lease_id    pg_catalog.text        NOT NULL,
	owner       pg_catalog.text        NOT NULL,
	mode        pg_catalog.text        NOT NULL CHECK (mode OPERATOR(pg_catalog.=) 'exclusive' OR mode OPERATOR(pg_catalog.=) 'shared'),
	acquired_at pg_catalog.timestamptz NOT NULL,
	expires_at  pg_catalog.timestamptz NOT NULL,
	metadata    pg_catalog.jsonb,
	PRIMARY KEY (resource, token)
);

CREATE INDEX IF NOT EXISTS {owner_idx} ON {holders} (owner);
CREATE INDEX IF NOT EXISTS {expiry_idx} ON {holders} (expires_at);
