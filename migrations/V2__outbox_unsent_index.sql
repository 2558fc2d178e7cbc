-- The outbox totals (/metrics, /readyz, `retrysafe outbox status`) count unsent and parked rows
-- and find the oldest. Without this index they scan every sent row the retention keeps.
CREATE INDEX outbox_events_unsent ON outbox_events (created_at) WHERE sent_at IS NULL;
