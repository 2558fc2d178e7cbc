-- The outbox drain's backlog (the drain and ordered scenarios of bench/scenarios.rs):
-- {drain_events} rows of CloudEvents shaped and sized like the daemon's own entry.created.
WITH e AS MATERIALIZED (
    SELECT g, gen_random_uuid() AS event_id, gen_random_uuid() AS entry_id,
           to_char(clock_timestamp() AT TIME ZONE 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS t
    FROM generate_series(1, {drain_events}) AS g
)
INSERT INTO outbox_events (event_id, event_key, client_id, idempotency_key, event_type, payload)
SELECT e.event_id, e.entry_id::text || '/entry.created', 'anonymous', 'drain-' || e.g, 'entry.created',
       jsonb_build_object(
           'specversion', '1.0', 'id', e.event_id, 'source', '/retrysafe', 'type', 'entry.created',
           'time', e.t, 'subject', e.entry_id, 'datacontenttype', 'application/json',
           'data', jsonb_build_object(
               'id', e.entry_id, 'kind', 'bench.write', 'created_at', e.t,
               'data', jsonb_build_object('seq', 1000000 + e.g, 'amount', 1250, 'currency', 'EUR',
                                          'note', 'retrysafe benchmark payload')))
FROM e ORDER BY e.g;
