-- Conversation content, kept only where `[log] content = true` (off by default): enough to
-- rebuild each conversation's transcript, so that `loopwarden replay --db` can replay the
-- logged conversations with another config. Every string in it has its credentials masked
-- (src/store/redact.rs, `Masked::json`), as in the summaries.

-- A conversation's head: its system/developer text and its task (the user messages before
-- the first assistant turn), as JSON `{"system": [...], "task": [...]}`.
CREATE TABLE conversation_content (
    conversation_id TEXT PRIMARY KEY,
    content         TEXT NOT NULL,
    request_id      INTEGER NOT NULL,     -- the request that last wrote the row
    seen_ms         INTEGER NOT NULL
);

-- One row per step (assistant turn) with the results of its calls and the user messages
-- after it, as JSON (`crate::transcript::Step`). A step logged before its results came is
-- written again, whole, by the request that carries them.
CREATE TABLE step_content (
    conversation_id TEXT NOT NULL,
    step            INTEGER NOT NULL,
    content         TEXT NOT NULL,
    request_id      INTEGER NOT NULL,
    seen_ms         INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, step)
);
CREATE INDEX step_content_by_seen ON step_content (seen_ms);
