-- The primary-key read of a completed idempotency record that a conventional implementation
-- runs to answer a replay; over the keys replay-1 .. replay-:keys (pgbench -D keys=N) that
-- bench/run created through the daemon.
\set i random(1, :keys)
SELECT response_json FROM idempotency_records WHERE client_id = 'anonymous' AND key = 'replay-' || :i::text;
