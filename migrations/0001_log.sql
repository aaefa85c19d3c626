-- The loopwarden log. Rows are appended (or upserted) by the proxy's background writer;
-- later features add rows, and new tables through new migrations, never rework these.
-- Times are Unix milliseconds; durations are microseconds. No header, API key or raw body
-- is ever stored: only hashes and short redacted summaries.

-- One row per conversation (see README "Conversation identity").
CREATE TABLE conversations (
    id            TEXT PRIMARY KEY,
    id_source     TEXT NOT NULL,      -- where the id came from: a header name, 'path', 'head_hash', 'fallback'
    client        TEXT,               -- product token of the user-agent (claude-cli, codex_exec, opencode...)
    dialect       TEXT,               -- openai_chat | openai_responses | anthropic | gemini
    model         TEXT,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    requests      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX conversations_by_last_seen ON conversations (last_seen_ms DESC);

-- One row per proxied request, written when its response has ended (or failed).
CREATE TABLE requests (
    id                  INTEGER PRIMARY KEY,  -- chosen by the proxy, so other rows can point at it before it is written
    conversation_id     TEXT NOT NULL,
    started_ms          INTEGER NOT NULL,
    method              TEXT NOT NULL,
    path                TEXT NOT NULL,        -- forwarded path, never the query (it may hold ?key=)
    upstream            TEXT NOT NULL,        -- openai | anthropic | gemini
    dialect             TEXT,                 -- NULL: not a conversation endpoint
    model               TEXT,
    stream              INTEGER NOT NULL,
    parse               TEXT NOT NULL,        -- parsed | unparsed | not_conversation
    parse_error         TEXT,
    steps               INTEGER,              -- assistant turns in the request's history
    decision            TEXT,                 -- the detection engine's action (observe, nudge, halt...)
    applied             TEXT NOT NULL,        -- what the proxy did: forwarded | forwarded_modified | answered
    status              INTEGER NOT NULL,     -- HTTP status the client got
    outcome             TEXT NOT NULL,        -- complete | client_disconnected | upstream_broken | upstream_unreachable | upstream_timeout | rejected
    request_bytes       INTEGER NOT NULL,
    response_bytes      INTEGER NOT NULL,
    upstream_latency_us INTEGER,              -- request sent -> response headers
    upstream_total_us   INTEGER,              -- request sent -> end of the response body
    proxy_overhead_us   INTEGER NOT NULL,     -- time spent by the proxy itself: total minus waiting for the upstream
    input_tokens        INTEGER,
    output_tokens       INTEGER,
    stop_reason         TEXT
);
CREATE INDEX requests_by_conversation ON requests (conversation_id, started_ms);

-- Each tool call of a conversation, by assistant turn ("step") and position in the turn.
-- A call is first recorded from the response that made it (no result yet), then completed
-- from the next request, whose history carries the result.
CREATE TABLE tool_calls (
    conversation_id TEXT NOT NULL,
    step            INTEGER NOT NULL,
    call_index      INTEGER NOT NULL,
    call_id         TEXT NOT NULL,
    name            TEXT NOT NULL,
    args_hash       TEXT NOT NULL,        -- blake3 of name + canonical arguments (hex)
    summary         TEXT NOT NULL,        -- short, redacted
    result_hash     TEXT,                 -- blake3 of the result text (hex)
    result_summary  TEXT,                 -- short, redacted
    is_error        INTEGER,
    request_id      INTEGER NOT NULL,     -- the request that last updated the row
    seen_ms         INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, step, call_index)
);

-- What detectors found (one row per finding per request).
CREATE TABLE findings (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id      INTEGER NOT NULL,
    conversation_id TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    detector        TEXT NOT NULL,
    confidence      REAL NOT NULL,
    step            INTEGER,              -- the latest step of the evidence
    steps           TEXT NOT NULL,        -- JSON array of step indexes
    summary         TEXT NOT NULL,
    suggestion      TEXT NOT NULL
);
CREATE INDEX findings_by_conversation ON findings (conversation_id, created_ms);

-- Every decision other than a plain observe, and what the proxy did with it.
CREATE TABLE decisions (
    request_id      INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    action          TEXT NOT NULL,
    applied         TEXT NOT NULL,        -- forwarded | forwarded_modified | answered
    step            INTEGER,              -- steps in the history when decided
    reason          TEXT NOT NULL
);
CREATE INDEX decisions_by_conversation ON decisions (conversation_id, created_ms);
