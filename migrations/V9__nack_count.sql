-- How many of an event's failed attempts the broker nacked. A nack is retried on a slower
-- schedule than other failures (each retry is one more copy for the queues that took the
-- message), and that schedule doubles with the nacks, not with every failed attempt: an event
-- that failed four times while a broker node was down, then was nacked once by a queue still
-- electing its leader, waits 30 seconds, not 8 minutes. Adding a column with a constant default
-- rewrites nothing.
ALTER TABLE outbox_events ADD COLUMN nacks integer NOT NULL DEFAULT 0;
