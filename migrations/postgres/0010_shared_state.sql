-- State several replicas share (issue 36), PostgreSQL only: SQLite serves one process,
-- whose memory holds this. Not a log table: its rows are replaced as they change.

-- Each replica's spend per conversation (`crate::budget::Ledger`), published every sync
-- (`crate::replicas`): a conversation's spend is its own replica's plus the others' rows.
-- `replica` is a process's id (a new one at each start: a restarted replica's earlier
-- spend stays counted under its old id). Columns as `requests`' spend columns summed.
CREATE TABLE replica_spend (
    replica             TEXT NOT NULL,
    conversation_id     TEXT NOT NULL,
    policy              TEXT,
    requests            BIGINT NOT NULL,
    unpriced            BIGINT NOT NULL,
    steps               BIGINT,
    input_tokens        BIGINT NOT NULL,
    cached_input_tokens BIGINT NOT NULL,
    cache_write_tokens  BIGINT NOT NULL,
    output_tokens       BIGINT NOT NULL,
    cost_usd            DOUBLE PRECISION NOT NULL,
    first_ms            BIGINT NOT NULL,
    last_ms             BIGINT NOT NULL,
    updated_ms          BIGINT NOT NULL,    -- when it was published (the publisher's clock)
    PRIMARY KEY (replica, conversation_id)
);
CREATE INDEX replica_spend_by_update ON replica_spend (updated_ms);
CREATE INDEX conversation_controls_by_update ON conversation_controls (updated_ms);

-- Requests held for a human (`crate::intervene::pause`): the replica holding one lists it
-- here so that any replica's admin API lists and decides it; the holder polls for its
-- verdicts (and is woken by NOTIFY loopwarden_pending). The row goes once the request is
-- answered. `info` is the admin API's JSON of it.
CREATE TABLE pending_requests (
    id              TEXT PRIMARY KEY,
    replica         TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    info            TEXT NOT NULL,
    created_ms      BIGINT NOT NULL,
    state           TEXT NOT NULL,      -- held | decided | abandoned (its replica stopped syncing)
    verdict         TEXT,               -- continue | nudge | halt, once decided
    updated_ms      BIGINT NOT NULL
);
CREATE INDEX pending_requests_by_replica ON pending_requests (replica, state);

-- The replicas syncing now: each one's last sync. A held request whose replica has not
-- synced for a while is marked abandoned by the others (its client's connection died
-- with it).
CREATE TABLE replicas (
    id      TEXT PRIMARY KEY,
    seen_ms BIGINT NOT NULL
);
