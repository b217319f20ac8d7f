-- The lock-manager tables. {resources}, {holders}, {owner_idx} and
-- {expiry_idx} are replaced by quoted identifiers before this runs.
-- Idempotent: Migrate may run at every start-up, from several processes at
-- once (it serialises on an advisory transaction lock).

-- One row per resource ever leased. Never delete rows here while the
-- resource may be leased again: fence is the per-resource fencing counter,
-- and deleting the row restarts it at 0, so the next token would be the
-- current timeline's floor, greatest(1, (timeline - 1) << 40) (1 on a server
-- never promoted; see token.go), whatever tokens were handed out before.
CREATE TABLE IF NOT EXISTS {resources} (
	resource            text        PRIMARY KEY,
	fence               bigint      NOT NULL DEFAULT 0,
	writer_intent       text,
	writer_intent_until timestamptz
);

-- One row per holder: one for an exclusive lease, one per reader for a
-- shared one. The primary key is also the lookup path of every statement.
CREATE TABLE IF NOT EXISTS {holders} (
	resource    text        NOT NULL,
	token       bigint      NOT NULL,
	lease_id    text        NOT NULL,
	owner       text        NOT NULL,
	mode        text        NOT NULL CHECK (mode IN ('exclusive', 'shared')),
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	metadata    jsonb,
	PRIMARY KEY (resource, token)
);

CREATE INDEX IF NOT EXISTS {owner_idx} ON {holders} (owner);
CREATE INDEX IF NOT EXISTS {expiry_idx} ON {holders} (expires_at);
