-- What the janitor deletes (the scale scenario): {scale_expired} records created 24 to 26 hours
-- ago, expired, and as many events sent 7 to 8 days ago, past outbox.retention.
INSERT INTO idempotency_records
    (client_id, key, request_hash, status, response_status, response_json, entry_id, created_at, expires_at)
SELECT r.client_id, gen_random_uuid()::text, r.request_hash, r.status, r.response_status,
       r.response_json, r.entry_id, t.at, t.at + interval '24 hours'
FROM idempotency_records r, generate_series(1, {scale_expired}) g,
     LATERAL (SELECT now() - interval '26 hours' + g * (interval '2 hours' / {scale_expired}) AS at) t
WHERE r.key = 'scale-template' ORDER BY g;
INSERT INTO outbox_events
    (event_id, event_key, client_id, idempotency_key, event_type, payload, created_at, attempts, next_attempt_at, sent_at)
SELECT gen_random_uuid(), 'expired-{nonce}-' || g || '/' || o.event_type, o.client_id, 'expired-{nonce}-' || g,
       o.event_type, o.payload, t.at, 1, t.at, t.at
FROM outbox_events o, generate_series(1, {scale_expired}) g,
     LATERAL (SELECT now() - interval '8 days' + g * (interval '1 day' / {scale_expired}) AS at) t
WHERE o.idempotency_key = 'scale-template' ORDER BY g;
ANALYZE idempotency_records;
ANALYZE outbox_events;
