-- GET /v1/entries: a client's entries in creation order, either way, a page at a time. The
-- listing walks this index from the cursor's (created_at, id) in either direction and stops
-- after a page, whatever the table's size; id makes the order total, so that entries with the
-- same created_at are neither repeated nor skipped between pages. A kind filter is checked on
-- the rows the walk meets.
--
-- IF NOT EXISTS: on a large table, build it beforehand without blocking writes
-- (CREATE INDEX CONCURRENTLY entries_client_created ON entries (client_id, created_at, id)),
-- and this migration finds it there (docs/operations.md, "Upgrades").
CREATE INDEX IF NOT EXISTS entries_client_created ON entries (client_id, created_at, id);
