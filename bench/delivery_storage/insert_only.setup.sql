-- insert_only: a narrow pending table, and sent_at in an insert-only delivery table
DROP INDEX outbox_events_due;
CREATE TABLE outbox_pending (id bigint PRIMARY KEY, next_attempt_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX outbox_pending_due ON outbox_pending (next_attempt_at, id);
CREATE TABLE outbox_deliveries (id bigint PRIMARY KEY, sent_at timestamptz NOT NULL);
