-- The scale scenario's database: {rows} rows per table copied from the one write of the daemon's
-- own (key scale-template) that is already in it, with fresh random UUID keys, UUIDv7 ids and
-- times over the last 20 hours, in time order, through the daemon's indexes; 1 % of the entries
-- of a rare kind, every event sent.
-- uuid7(t): a UUID whose first 48 bits are t in milliseconds, as the daemon's ids (v7).
CREATE FUNCTION pg_temp.uuid7(t timestamptz) RETURNS uuid LANGUAGE sql AS $$
    SELECT encode(overlay(uuid_send(gen_random_uuid())
           PLACING substring(int8send((extract(epoch FROM t) * 1000)::bigint) FROM 3)
           FROM 1 FOR 6), 'hex')::uuid $$;
CREATE UNLOGGED TABLE scale_rows AS
SELECT g, gen_random_uuid()::text AS key, pg_temp.uuid7(at) AS entry_id, pg_temp.uuid7(at) AS event_id, at
FROM generate_series(1, {rows}) g,
     LATERAL (SELECT now() - interval '20 hours' + g * (interval '20 hours' / {rows}) AS at) t;
INSERT INTO idempotency_records
    (client_id, key, request_hash, status, response_status, response_json, entry_id, created_at, expires_at)
SELECT r.client_id, s.key, r.request_hash, r.status, r.response_status, r.response_json,
       s.entry_id, s.at, s.at + interval '24 hours'
FROM scale_rows s, idempotency_records r WHERE r.key = 'scale-template' ORDER BY s.g;
INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
SELECT s.entry_id, e.client_id, s.key, CASE WHEN s.g % 100 = 0 THEN 'bench.rare' ELSE e.kind END, e.data, s.at
FROM scale_rows s, entries e WHERE e.idempotency_key = 'scale-template' ORDER BY s.g;
INSERT INTO outbox_events
    (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at,
     attempts, next_attempt_at, sent_at, traceparent)
SELECT s.event_id, s.entry_id || '/' || o.event_type, o.client_id, s.key, o.event_type,
       o.payload, s.at, 1, s.at, s.at + interval '20 ms', o.traceparent
FROM scale_rows s, outbox_events o WHERE o.idempotency_key = 'scale-template' ORDER BY s.g;
DROP TABLE scale_rows;
