-- Replays (`retrysafe outbox replay`): past events published again, with their original event
-- ids. A replay never updates outbox_events: the relay's rows, its partial indexes and the
-- delivery record (sent_at, attempts) stay as the relay left them.

-- One row per replay: what was asked for, by whom, and how far it got. Kept after it finishes,
-- as the record of what was sent again (a few rows per operator action; never purged).
CREATE TABLE replays (
    id              bigserial   PRIMARY KEY,
    -- The selectors and the target as given on the command line, normalized (a relative
    -- `--since 24h` stays "24h"): what `outbox status` shows, and what selection_hash covers.
    selection       jsonb       NOT NULL,
    -- SHA-256 of the normalized selection and target: "the same command", so that running it
    -- again resumes an unfinished replay instead of starting another.
    selection_hash  bytea       NOT NULL,
    -- 'exchange:<amqp.exchange>' (routing key = event type) or 'queue:<name>' (published
    -- through the default exchange to that queue alone).
    target          text        NOT NULL,
    -- The operating-system user who ran the command, and the host.
    requested_by    text        NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    -- Last recorded progress; with status 'running' and an old time, the process died.
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    status          text        NOT NULL
        CHECK (status IN ('running', 'interrupted', 'failed', 'completed')),
    -- The event set, fixed when the replay starts, so that a resumed replay sends the rest of
    -- the same set: creation-time bounds (a relative --since resolved then), and the newest
    -- outbox id then (events written later reach bound queues through the relay).
    created_since   timestamptz,
    created_until   timestamptz,
    max_event_id    bigint      NOT NULL,
    events_total    bigint      NOT NULL,
    -- Distinct events the broker confirmed (the rows of event_replays).
    events_sent     bigint      NOT NULL DEFAULT 0,
    -- Resume point: events are replayed in outbox id order, and every event up to this id has
    -- been sent (or was not selected).
    last_event_id   bigint      NOT NULL DEFAULT 0,
    -- Why a failed replay stopped.
    last_error      text
);

-- At most one unfinished replay per selection: running the same command again finds it here
-- (and resumes it), and two operators starting the same replay at once cannot make two.
-- Partial, so finished replays (the many) are not in it.
CREATE UNIQUE INDEX replays_unfinished_selection ON replays (selection_hash)
    WHERE status <> 'completed';

-- Which replay sent which event, insert-only: an event's replay count and last replay time
-- (GET /v1/idempotency-keys/{key}) without touching its outbox row. The primary key serves that
-- lookup (event_id first) and makes recording a batch again after a resume a no-op. No foreign
-- key to outbox_events: it would add a referential check to the relay's updates and the
-- janitor's deletes of outbox rows, and fail a replay's batch whose event the janitor deleted
-- meanwhile; the janitor deletes these rows with their event instead.
CREATE TABLE event_replays (
    event_id    uuid        NOT NULL,
    replay_id   bigint      NOT NULL REFERENCES replays (id),
    replayed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, replay_id)
);
