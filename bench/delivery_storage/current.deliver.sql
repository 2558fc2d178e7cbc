-- Delivery as the relay does it today: claim 1,000 due rows FOR UPDATE SKIP LOCKED through the
-- partial index outbox_events_due, then set sent_at (a non-HOT update: the partial indexes name
-- sent_at, so every index gets an entry for the new row version), commit; until none is due.
DO $$
DECLARE ids bigint[]; n int;
BEGIN
  LOOP
    SELECT array_agg(id), sum(length(p)) INTO ids, n FROM (
      SELECT id, event_id, event_type, client_id, idempotency_key, payload::text AS p, attempts, created_at
      FROM outbox_events
      WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
      ORDER BY next_attempt_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED) s;
    EXIT WHEN ids IS NULL;
    UPDATE outbox_events SET sent_at = now(), last_error = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;
