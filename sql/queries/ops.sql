-- Operations: retention (sql/functions/080_retention.sql) and the reader role (090_reader.sql).

-- prune_requests --
-- Delete terminal requests finished before p_before (and their events); how many went.
SELECT respool.prune_requests(p_before => $1, p_limit => $2);

-- prune_older_than --
-- prune_requests with p_before = now() - $1 seconds on the database clock.
SELECT respool.prune_requests(p_before => now() - make_interval(secs => $1::double precision),
                              p_limit => $2);

-- retention_cutoff --
-- now() - $1 seconds on the database clock.
SELECT now() - make_interval(secs => $1::double precision);

-- grant_reader --
-- Make a role a respool_reader member (identifiers are quoted inside the function).
SELECT respool.grant_reader(p_role => $1, p_statement_timeout_ms => $2, p_create => $3);

-- revoke_reader --
-- Undo grant_reader for a role.
SELECT respool.revoke_reader(p_role => $1);
