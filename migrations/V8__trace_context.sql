-- The trace context of the write that made an event (W3C traceparent and tracestate), kept with
-- the event so that every publication of it, the relay's and a replay's, carries the write's
-- context rather than the publisher's. Nullable without a default: adding them rewrites
-- nothing, and events written before have none.
ALTER TABLE outbox_events
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;
