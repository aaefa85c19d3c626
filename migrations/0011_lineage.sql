-- One run across context compactions (issue 44): a run's requests are logged under the
-- run's id, also those of a conversation that continued it from a summary under an id of
-- its own; the run's steps are numbered on across the compaction.

-- The compaction marker of a summary request (the request that asks the model for the
-- summary that replaces the history: `claude_summary`, `codex_request_kind`, ...;
-- `crate::dialect::compaction::Marker`), NULL for any other request.
ALTER TABLE requests ADD COLUMN compaction TEXT;
-- The id a request stated when it was logged under the run it continues, under another
-- id (Claude Code's auto-compact starts a new session id), NULL otherwise.
ALTER TABLE requests ADD COLUMN stated_id TEXT;
