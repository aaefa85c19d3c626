-- As migrations/0009_content.sql.
CREATE TABLE conversation_content (
    conversation_id TEXT PRIMARY KEY,
    content         TEXT NOT NULL,
    request_id      BIGINT NOT NULL,
    seen_ms         BIGINT NOT NULL
);

CREATE TABLE step_content (
    conversation_id TEXT NOT NULL,
    step            BIGINT NOT NULL,
    content         TEXT NOT NULL,
    request_id      BIGINT NOT NULL,
    seen_ms         BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, step)
);
CREATE INDEX step_content_by_seen ON step_content (seen_ms);
