-- One vocabulary for what was done about a request (`Applied` in src/intervene/mod.rs):
-- forwarded | nudged | replanned | rolled_back | halted | held | blocked | resumed |
-- failed_open, in requests.applied, decisions.applied and interventions.applied alike.
-- requests and decisions used to say only how the request went (forwarded_modified,
-- answered); rows written before take the intervention log's word for their request (its
-- last row: after a pause, the verdict's), else a halt for an answer.
UPDATE requests SET applied = COALESCE(
    (SELECT i.applied FROM interventions i
      WHERE i.request_id = requests.id ORDER BY i.id DESC LIMIT 1),
    CASE applied WHEN 'answered' THEN 'halted' ELSE applied END)
WHERE applied IN ('forwarded_modified', 'answered');

UPDATE decisions SET applied = (SELECT r.applied FROM requests r WHERE r.id = decisions.request_id)
WHERE applied IN ('forwarded_modified', 'answered')
  AND EXISTS (SELECT 1 FROM requests r WHERE r.id = decisions.request_id);
