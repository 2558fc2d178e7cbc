-- A narrow pending table as in pending_hot, and sent_at kept in an insert-only delivery table
-- instead of outbox_events: the event row is never written again.
DO $$
DECLARE ids bigint[]; n int;
BEGIN
  LOOP
    SELECT array_agg(id), sum(length(p)) INTO ids, n FROM (
      SELECT e.id, e.event_id, e.event_type, e.client_id, e.idempotency_key, e.payload::text AS p, e.attempts, e.created_at
      FROM outbox_pending p JOIN outbox_events e ON e.id = p.id
      WHERE p.next_attempt_at <= now()
      ORDER BY p.next_attempt_at, p.id LIMIT 1000 FOR UPDATE OF p SKIP LOCKED) s;
    EXIT WHEN ids IS NULL;
    DELETE FROM outbox_pending WHERE id = ANY(ids);
    INSERT INTO outbox_deliveries SELECT unnest(ids), now();
    COMMIT;
  END LOOP;
END $$;
