-- Autovacuum for the two tables the janitor deletes from, sized for tables at retention size
-- (docs/scaling.md, "Tables at retention size"). With PostgreSQL's default scale factor (0.2),
-- vacuum comes after a fifth of a table is dead: at 1,000 writes/s and the default retentions,
-- about 17 million dead records (5 hours) and 120 million dead outbox rows (17 hours; a sent
-- event leaves two, its update and its delete). Until then, the janitor's deletes and the
-- relays' claims walk the dead entries of the indexes they start from, and the tables bloat.
-- At 0.02, vacuum comes every 29 minutes for the records and every 100 minutes for the outbox
-- at that rate; a VACUUM after 500,000 deletes on 5 million rows took 5.6 s (records) and 5.0 s
-- (outbox) (bench/scale); a VACUUM reads each index of its table whole, so at retention size
-- (17 times the rows) it takes about 17 times as long: a few percent of one core, throttled as
-- autovacuum is. The threshold keeps small tables from being vacuumed after every few hundred
-- deletes.
--
-- These are storage parameters of the tables: ALTER TABLE ... RESET (...) gives the server's
-- settings back. They do nothing where autovacuum is off on the server.
ALTER TABLE idempotency_records SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000
);
ALTER TABLE outbox_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000
);
