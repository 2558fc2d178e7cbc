-- pending_hot: a narrow pending table; no index names sent_at, so marking sent is a HOT update
DROP INDEX outbox_events_due;
DROP INDEX outbox_events_parked;
CREATE INDEX outbox_events_parked ON outbox_events (id) WHERE failed_at IS NOT NULL;
ALTER TABLE outbox_events SET (fillfactor = 50);
CREATE TABLE outbox_pending (id bigint PRIMARY KEY, next_attempt_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX outbox_pending_due ON outbox_pending (next_attempt_at, id);
