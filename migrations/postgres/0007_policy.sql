-- As migrations/0007_policy.sql.
ALTER TABLE requests ADD COLUMN policy TEXT;
ALTER TABLE decisions ADD COLUMN policy TEXT;
ALTER TABLE interventions ADD COLUMN policy TEXT;
CREATE INDEX requests_by_policy ON requests (policy, started_ms);
