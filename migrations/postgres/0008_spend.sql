-- As migrations/0008_spend.sql.
ALTER TABLE requests ADD COLUMN cached_input_tokens BIGINT;
ALTER TABLE requests ADD COLUMN cache_write_tokens BIGINT;
ALTER TABLE requests ADD COLUMN cost_usd DOUBLE PRECISION;
