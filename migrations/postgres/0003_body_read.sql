-- As migrations/0003_body_read.sql.
ALTER TABLE requests ADD COLUMN body_read_us BIGINT;
