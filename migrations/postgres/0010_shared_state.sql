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
