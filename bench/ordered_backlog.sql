-- The ordered drain's backlog (the ordered scenario): after drain_backlog.sql on a fresh
-- database (ids 1..{drain_events}), the same events as writes of {ordering_keys} ordering keys
-- in turn, each key's events numbered 1, 2, 3, ... as the writer numbers them: the head of each
-- key due now, the rest held (due at infinity) until the relay that confirms their predecessor
-- releases them, and each key's counter in ordering_keys.
UPDATE outbox_events
SET ordering_key = 'key-' || ((id - 1) % {ordering_keys}),
    sequence = (id - 1) / {ordering_keys} + 1,
    next_attempt_at = CASE WHEN (id - 1) / {ordering_keys} = 0 THEN now() ELSE 'infinity' END;
INSERT INTO ordering_keys (client_id, ordering_key, last_sequence, done_through)
SELECT client_id, ordering_key, max(sequence), 0
FROM outbox_events
GROUP BY client_id, ordering_key;
