-- The policy each request was under (issue 35): every row that says what loopwarden did
-- names the policy that made it so, so that a team can read one policy's decisions apart
-- (a shadow policy's would-be halts beside an enforcing one's halts). NULL: a row written
-- before policies existed, or an operator's act, which concerns no request.
ALTER TABLE requests ADD COLUMN policy TEXT;
ALTER TABLE decisions ADD COLUMN policy TEXT;
ALTER TABLE interventions ADD COLUMN policy TEXT;
CREATE INDEX requests_by_policy ON requests (policy, started_ms);
