-- Ordered delivery per ordering key (README "Ordered delivery"). Writes of one client with one
-- ordering key get sequence 1, 2, 3, ... in the order they commit; a relay publishes an event
-- of a key only once every event of the key's earlier writes was confirmed (or skipped).
-- Every column is nullable without a default, so adding them rewrites nothing.

ALTER TABLE entries
    ADD COLUMN ordering_key text,
    ADD COLUMN sequence     bigint;

ALTER TABLE outbox_events
    ADD COLUMN ordering_key text,
    ADD COLUMN sequence     bigint,
    -- Given up on for good (`retrysafe outbox skip`): never published; failed_at is set too,
    -- so a skipped row is out of the relays' reach. Who skipped it and why: outbox_skips.
    ADD COLUMN skipped_at   timestamptz;

-- One row per (client, ordering key): the counter that numbers its writes, and how far its
-- events are done. A writer takes the row's lock (an upsert) in the write's own transaction,
-- after the idempotency records and in (client_id, ordering_key) order, so writes of one key
-- serialize on it and commit in sequence order; a rolled-back write rolls its number back too,
-- so sequences have no gap. Relays (and `outbox skip`) take the same lock, in the same order,
-- to move done_through on.
CREATE TABLE ordering_keys (
    client_id     text   NOT NULL,
    ordering_key  text   NOT NULL,
    -- The sequence of the key's last committed write.
    last_sequence bigint NOT NULL,
    -- Every event of the key's writes up to this sequence is sent or skipped: a write numbered
    -- done_through + 1 may be published at once, a later one waits (is held).
    done_through  bigint NOT NULL,
    PRIMARY KEY (client_id, ordering_key)
);

-- The unsent events of ordered writes, by key and sequence: a key's head (its lowest unsent
-- sequence), whether an event has an earlier unsent one (the relays' claim), what a parked
-- head blocks. Partial: unordered events are not in it and pay nothing for it, and sent or
-- skipped rows leave it.
--
-- IF NOT EXISTS: on a large table, build it beforehand without blocking writes (CREATE INDEX
-- CONCURRENTLY with this definition; docs/operations.md, "Upgrades").
CREATE INDEX IF NOT EXISTS outbox_events_ordered_unsent
    ON outbox_events (client_id, ordering_key, sequence)
    WHERE sent_at IS NULL AND skipped_at IS NULL AND ordering_key IS NOT NULL;

-- Events given up on (`retrysafe outbox skip`): who, when and why, from what whoever runs the
-- command cannot set (the OS user id of the process, the session's database role). Kept as
-- the record of what was never delivered (a few rows per operator action; never purged).
CREATE TABLE outbox_skips (
    event_id          uuid        PRIMARY KEY,
    event_type        text        NOT NULL,
    client_id         text        NOT NULL,
    ordering_key      text,
    sequence          bigint,
    skipped_at        timestamptz NOT NULL DEFAULT now(),
    requested_uid     bigint,
    requested_db_user text        NOT NULL DEFAULT current_user,
    reason            text        NOT NULL
);
