-- The dashboard (issue 37): a human's word on each alert, and the team a conversation's
-- requests named, so the conversation list can be filtered by team.

-- One row per verdict given on a finding or an intervention (the latest row for a target
-- is the one that counts). Exactly one of finding_id and intervention_id is set. The
-- detector is copied from the target when the verdict is given, so precision per detector
-- reads this table alone.
CREATE TABLE feedback (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    finding_id       INTEGER,
    intervention_id  INTEGER,
    conversation_id  TEXT NOT NULL,
    detector         TEXT NOT NULL,
    verdict          TEXT NOT NULL,      -- right | wrong
    note             TEXT NOT NULL,
    created_ms       INTEGER NOT NULL,
    CHECK ((finding_id IS NULL) <> (intervention_id IS NULL))
);
CREATE INDEX feedback_by_finding ON feedback (finding_id) WHERE finding_id IS NOT NULL;
CREATE INDEX feedback_by_intervention ON feedback (intervention_id) WHERE intervention_id IS NOT NULL;

-- The team (`/t/{team}` or `x-loopwarden-team`) of the conversation's first request that
-- named one. NULL: none did, or it was logged before this column.
ALTER TABLE conversations ADD COLUMN team TEXT;
