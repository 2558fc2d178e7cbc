-- Who ran a replay, from what whoever runs the command cannot set: the process's
-- operating-system user id (requested_by's user name is now looked up from it, no longer taken
-- from $USER, $LOGNAME or $SUDO_USER) and the database role the command's session ran as
-- (current_user). Null for the replays recorded before.
ALTER TABLE replays
    ADD COLUMN requested_uid     bigint,
    ADD COLUMN requested_db_user text;
