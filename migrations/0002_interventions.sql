-- Interventions (src/intervene/): what loopwarden did to a conversation, and the state
-- that keeps a halted conversation halted across restarts.

-- One row per intervention: a reminder appended, a rollback, a halt (by policy, sticky or
-- by hand), a blocked response, a pause and how it was decided, a resume.
CREATE TABLE interventions (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id  TEXT NOT NULL,
    request_id       INTEGER,            -- the request it applied to (NULL for operator actions)
    created_ms       INTEGER NOT NULL,
    action           TEXT NOT NULL,      -- nudge | replan | rollback | halt | block | pause | resume
    applied          TEXT NOT NULL,      -- what was done: nudged, replanned, rolled_back, halted, held, forwarded, failed_open...
    source           TEXT NOT NULL,      -- policy | sticky | operator | human | timeout
    detector         TEXT NOT NULL,      -- the pattern that led it ('' for operator actions)
    reason           TEXT NOT NULL,
    finding          TEXT NOT NULL       -- the leading finding's one-line summary
);
CREATE INDEX interventions_by_conversation ON interventions (conversation_id, created_ms);

-- Sticky halts and resumes (see src/intervene/controls.rs).
CREATE TABLE conversation_controls (
    conversation_id  TEXT PRIMARY KEY,
    halted           INTEGER NOT NULL,
    reason           TEXT NOT NULL,
    source           TEXT NOT NULL,      -- policy | operator | human
    humans_at_halt   INTEGER,            -- human messages when halted; NULL until the next request after an operator's halt
    resume_pending   INTEGER NOT NULL,   -- resumed; the next request records where
    resumed_at       TEXT NOT NULL,      -- JSON array of request indexes (steps carried) where it was resumed
    updated_ms       INTEGER NOT NULL
);
