-- The index outbox_events (client_id, idempotency_key) served one query, the key lookup's list
-- of a key's events (GET /v1/idempotency-keys/{key}), and cost every event an insert at a random
-- place of a large index (clients' keys are random): at tens of millions of rows, most of the
-- WAL a write makes was full-page images of it and of idempotency_records_pkey. The lookup now
-- finds a key's events by their event_key ('<entry id>/<event type>', unique, so indexed
-- already), from the entry id its record holds.
--
-- Dropping it takes a short exclusive lock on outbox_events. During a rolling upgrade, a daemon
-- of the version before answers key lookups with a scan of the outbox until it is upgraded.
DROP INDEX IF EXISTS outbox_events_client_key;
