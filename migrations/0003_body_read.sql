-- How long the request body took to arrive: from the request head to the body's last byte.
-- That is the client sending, not the proxy working, yet it is part of proxy_overhead_us
-- (total minus waiting for the upstream); with this, the proxy's own work is the difference.
-- NULL on rows logged before this column existed.
ALTER TABLE requests ADD COLUMN body_read_us INTEGER;
