-- The per-request transaction of a conventional (one transaction per request) implementation:
-- claim the idempotency key, write the entry, write its outbox event, commit. Five round trips.
-- Sizes match what retrysafe stores for bench/unique_keys.lua's ~110-byte body: response_json
-- ~214 bytes, entries.data ~90 bytes, outbox payload ~470 bytes (jsonb text). The JSON is built
-- per transaction (so PostgreSQL parses it every time, as it would a parameter), the ids are
-- derived from the key with md5 (a conventional app would send a UUID it generated).
\set r random(1, 999999999999)
BEGIN;
INSERT INTO idempotency_records
    (client_id, key, request_hash, status, response_status, response_json, entry_id, created_at, expires_at)
VALUES ('anonymous', 'pgb-' || :client_id::text || '-' || :r::text,
    sha256(convert_to('pgb-' || :client_id::text || '-' || :r::text, 'UTF8')), 'completed', 201,
    ('{"created_at":"2026-12-02T11:59:01.521728Z","data":{"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload","seq":'
        || :r::text || '},"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text || '","kind":"bench.write"}')::jsonb,
    md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, now(), now() + interval '24 hours');
INSERT INTO entries (id, client_id, idempotency_key, kind, data, created_at)
VALUES (md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'anonymous', 'pgb-' || :client_id::text || '-' || :r::text,
    'bench.write',
    ('{"seq":' || :r::text || ',"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}')::jsonb, now());
INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type, payload)
VALUES (md5('evt-' || :client_id::text || '-' || :r::text)::uuid,
    md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text || '/entry.created',
    'anonymous', 'pgb-' || :client_id::text || '-' || :r::text, 'entry.created',
    ('{"id":"' || md5('evt-' || :client_id::text || '-' || :r::text)::uuid::text
        || '","data":{"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text
        || '","data":{"seq":' || :r::text || ',"note":"retrysafe benchmark payload","amount":1250,"currency":"EUR"},"kind":"bench.write","created_at":"2026-12-02T11:59:01.521728Z"},'
        || '"time":"2026-12-02T11:59:01.521728Z","type":"entry.created","source":"/retrysafe","subject":"'
        || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text
        || '","specversion":"1.0","datacontenttype":"application/json"}')::jsonb);
COMMIT;
