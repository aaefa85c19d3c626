-- As migrations/0004_conversation_overhead.sql (a new database: nothing to sum).
ALTER TABLE conversations ADD COLUMN proxy_overhead_us_sum BIGINT NOT NULL DEFAULT 0;
