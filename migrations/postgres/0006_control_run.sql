-- As migrations/0006_control_run.sql.
ALTER TABLE conversation_controls ADD COLUMN run_steps BIGINT;
ALTER TABLE conversation_controls ADD COLUMN run_digest TEXT;
