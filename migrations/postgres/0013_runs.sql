-- Runs that outlive a process (issue 52): what a run needs to go on after a compaction,
-- kept so that a continuation (or a chained Responses request) served by another replica,
-- or after a restart, joins its run (`crate::proxy::memory::lineage`,
-- `crate::proxy::upstream::response_chain`). Written off the request path by the log
-- writer, a row per summary request, continuation link or stored answer (most requests
-- write none); read on a miss in a process's memory only. Kept a day after it was last
-- written (the lineage's day), then deleted by the writer.

-- A run that compacted its context: its state at its last summary request, and who sent
-- it (the API key's fingerprint, never the key; the client's product name; the team and
-- the policy): what a continuation under a new id must share with it to join it.
CREATE TABLE runs (
    id                TEXT PRIMARY KEY,   -- the run's id (the log's conversation_id)
    key_id            TEXT,               -- `crate::policy::key_id` of the request's key
    client            TEXT,               -- the user-agent's product token
    team              TEXT,
    policy            TEXT NOT NULL,
    compacted_ms      BIGINT NOT NULL,    -- its last summary request
    awaiting          BOOLEAN NOT NULL,   -- no conversation continued from it yet
    server_compaction BIGINT,             -- the API's compaction its state was taken at
    carry             BYTEA NOT NULL,     -- the detection fold then (`EngineState::to_stored`)
    last_ms           BIGINT NOT NULL     -- its last summary request or continuation
);
CREATE INDEX runs_awaiting ON runs (key_id, compacted_ms) WHERE awaiting;
CREATE INDEX runs_by_last ON runs (last_ms);

-- A conversation that continues a run under another id (Claude Code's auto-compact starts
-- a new session id): its requests are the run's.
CREATE TABLE run_links (
    conversation_id TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    linked_ms       BIGINT NOT NULL
);
CREATE INDEX run_links_by_time ON run_links (linked_ms);

-- A Responses answer a client asked the API to store (`store: true`), so that a request
-- naming it by `previous_response_id` is read with its history on any replica: the input
-- items its request added, then the answer's output items (a JSON array), and the answer
-- its request continued.
CREATE TABLE stored_responses (
    id        TEXT PRIMARY KEY,
    parent_id TEXT,
    items     TEXT NOT NULL,
    made_here BOOLEAN NOT NULL,           -- loopwarden wrote the answer (a halt)
    stored_ms BIGINT NOT NULL
);
CREATE INDEX stored_responses_by_time ON stored_responses (stored_ms);
