-- One row per (client, idempotency key) whose write completed. The primary key is the final
-- guard against a duplicate write, also when several daemons share this database.
CREATE TABLE idempotency_records (
    client_id       text        NOT NULL,
    key             text        NOT NULL,
    request_hash    bytea       NOT NULL,
    status          text        NOT NULL,
    response_status smallint    NOT NULL,
    response_json   jsonb       NOT NULL,
    entry_id        uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (client_id, key)
);

-- The janitor deletes expired records in small batches, oldest first.
CREATE INDEX idempotency_records_expires_at ON idempotency_records (expires_at);

CREATE TABLE entries (
    id              uuid        PRIMARY KEY,
    client_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    kind            text        NOT NULL,
    data            jsonb       NOT NULL,
    created_at      timestamptz NOT NULL
);

CREATE TABLE outbox_events (
    id              bigserial   PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    -- '<entry id>/<event type>': one event of each type per entry, whatever retries happen.
    event_key       text        NOT NULL UNIQUE,
    client_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        int         NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    sent_at         timestamptz,
    failed_at       timestamptz
);

-- Lookups of a key's events (GET /v1/idempotency-keys/{key}); not unique, a key has several.
CREATE INDEX outbox_events_client_key ON outbox_events (client_id, idempotency_key);

-- What relays claim: due rows that are neither sent nor parked. Partial, so it stays as small
-- as the backlog however many sent rows await the janitor; created_at rides along so that the
-- age of the oldest unsent event is read from the index alone.
CREATE INDEX outbox_events_due ON outbox_events (next_attempt_at, id) INCLUDE (created_at)
    WHERE sent_at IS NULL AND failed_at IS NULL;

-- Parked events, for the backlog figures and `retrysafe outbox retry`; empty in normal running.
CREATE INDEX outbox_events_parked ON outbox_events (id)
    WHERE sent_at IS NULL AND failed_at IS NOT NULL;

-- No index on sent_at: every index is written again when a relay sets sent_at (which no HOT
-- update can avoid, since the partial indexes name it), and the janitor finds old sent rows in
-- id order instead, oldest first.

-- Consumer-side inbox: a consumer applies an event's effect only when this insert is new.
CREATE TABLE processed_events (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
