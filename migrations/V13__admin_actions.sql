-- The admin listener's actions (POST /admin/v1/events/retry and /skip, and the console's
-- buttons): which admin, when, with what selector, how many events it changed. Kept like
-- replays (never purged: a row per operator action).
--
-- The Idempotency-Key of an admin's POST is stored here as a client's is in
-- idempotency_records: the same admin sending the same key again gets the first answer
-- (`response`) instead of acting twice, and another request under that key is refused
-- (request_hash). The row is written in the transaction that changes the events, so an
-- action and its record commit together or not at all.
CREATE TABLE admin_actions (
    id              bigserial   PRIMARY KEY,
    admin_id        text        NOT NULL,
    idempotency_key text        NOT NULL,
    -- SHA-256 of the action and its selector as parsed (not of the body's bytes).
    request_hash    bytea       NOT NULL,
    action          text        NOT NULL CHECK (action IN ('retry', 'skip')),
    selector        jsonb       NOT NULL,
    -- Events the action changed (requeued, or skipped).
    changed         bigint      NOT NULL,
    -- The answer given, returned again to a retry of the request.
    response        jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (admin_id, idempotency_key)
);

-- Who skipped an event through the admin API or the console (requested_uid is then null).
ALTER TABLE outbox_skips ADD COLUMN admin_id text;
