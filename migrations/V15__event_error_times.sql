-- An event's failed attempts as an operator reads them on its page (the admin API's and the
-- console's): the first error and when it happened, and when the last one (`last_error`)
-- happened. The relay sets them with `last_error`, in the update that records a failed
-- attempt, so a delivery that succeeds at once writes nothing more. The first error is kept
-- through a requeue (the event's history); a send clears `last_error` but keeps the times.
-- Nullable without a default: adding them rewrites nothing, and events that failed before have
-- none.
ALTER TABLE outbox_events
    ADD COLUMN first_error    text,
    ADD COLUMN first_error_at timestamptz,
    ADD COLUMN last_error_at  timestamptz;
