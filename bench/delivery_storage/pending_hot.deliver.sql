-- A narrow pending table: claim its rows FOR UPDATE SKIP LOCKED (joined to the events for the
-- message), delete them, and set outbox_events.sent_at, which no index names now: a HOT update
-- (the table's fillfactor leaves room on each page), no index entry, and only the changed bytes
-- in the WAL.
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
    UPDATE outbox_events SET sent_at = now(), last_error = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;
