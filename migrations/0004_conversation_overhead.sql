-- The sum of a conversation's requests' proxy_overhead_us, kept as they are logged, so that
-- the admin API's conversation list shows each conversation's mean overhead (this over
-- `requests`) without averaging every request of it on each call: that read was linear in
-- a conversation's length. Rows logged before this column existed are summed once here.
ALTER TABLE conversations ADD COLUMN proxy_overhead_us_sum INTEGER NOT NULL DEFAULT 0;
UPDATE conversations SET proxy_overhead_us_sum = coalesce(
    (SELECT sum(r.proxy_overhead_us) FROM requests r WHERE r.conversation_id = conversations.id),
    0);
