-- Every key of the write tables includes client_id, so that they can be distributed by it
-- (Citus requires every primary key and unique constraint of a distributed table to include
-- its distribution column; docs/scaling.md). On a single server nothing else changes: ids and
-- event ids are drawn as before, unique by themselves; the constraints now also name the
-- client, and every statement that finds a row by its id names the client too.
--
--   entries          primary key (client_id, id)
--   outbox_events    primary key (client_id, id), unique (client_id, event_id),
--                    unique (client_id, event_key)
--   outbox_skips     primary key (client_id, event_id)
--   event_replays    client_id added; primary key (client_id, event_id, replay_id)
--
-- Two indexes replace what the old single-column keys served for the operators' queries that
-- do not name a client: outbox_events (id), for walks in id order (a replay, the admin API's
-- pages), and outbox_events (event_id), for `outbox skip/retry --event ID` and the admin API's
-- event ids. Both columns grow with time (a sequence, UUIDv7), so their inserts land at the
-- right edge of the index.
--
-- On a large table each new unique index is built under the table's lock, as the old one was
-- built. To avoid that, build them beforehand without blocking writes, and this migration uses
-- them (docs/operations.md, "Upgrades"):
--   CREATE UNIQUE INDEX CONCURRENTLY entries_client_id_id ON entries (client_id, id);
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_events_client_id_id ON outbox_events (client_id, id);
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_events_client_event_id ON outbox_events (client_id, event_id);
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_events_client_event_key ON outbox_events (client_id, event_key);
--   CREATE INDEX CONCURRENTLY outbox_events_id ON outbox_events (id);
--   CREATE INDEX CONCURRENTLY outbox_events_event_id ON outbox_events (event_id);

CREATE UNIQUE INDEX IF NOT EXISTS entries_client_id_id ON entries (client_id, id);
ALTER TABLE entries
    DROP CONSTRAINT entries_pkey,
    ADD CONSTRAINT entries_pkey PRIMARY KEY USING INDEX entries_client_id_id;

CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_client_id_id ON outbox_events (client_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_client_event_id
    ON outbox_events (client_id, event_id);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_client_event_key
    ON outbox_events (client_id, event_key);
CREATE INDEX IF NOT EXISTS outbox_events_id ON outbox_events (id);
CREATE INDEX IF NOT EXISTS outbox_events_event_id ON outbox_events (event_id);
ALTER TABLE outbox_events
    DROP CONSTRAINT outbox_events_pkey,
    DROP CONSTRAINT outbox_events_event_id_key,
    DROP CONSTRAINT outbox_events_event_key_key,
    ADD CONSTRAINT outbox_events_pkey PRIMARY KEY USING INDEX outbox_events_client_id_id,
    ADD CONSTRAINT outbox_events_event_id_key UNIQUE USING INDEX outbox_events_client_event_id,
    ADD CONSTRAINT outbox_events_event_key_key UNIQUE USING INDEX outbox_events_client_event_key;

ALTER TABLE outbox_skips
    DROP CONSTRAINT outbox_skips_pkey,
    ADD CONSTRAINT outbox_skips_pkey PRIMARY KEY (client_id, event_id);

-- A replay record of an event whose row the janitor has deleted has no client to take: it is
-- of no use any more (the janitor deletes them with their event).
ALTER TABLE event_replays ADD COLUMN client_id text;
UPDATE event_replays r SET client_id = o.client_id FROM outbox_events o WHERE o.event_id = r.event_id;
DELETE FROM event_replays WHERE client_id IS NULL;
ALTER TABLE event_replays
    ALTER COLUMN client_id SET NOT NULL,
    DROP CONSTRAINT event_replays_pkey,
    ADD CONSTRAINT event_replays_pkey PRIMARY KEY (client_id, event_id, replay_id);
