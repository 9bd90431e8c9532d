-- migrate_keep_functions --
-- The names (comma-separated, $1) of the functions the migrations create: drop_respool_functions,
-- in the same transaction, keeps them (set_config local to the transaction).
SELECT set_config('respool.migration_functions', $1, true);

-- drop_respool_functions --
-- Before the function files are re-applied (same transaction): drop every function and procedure
-- in schema respool that only other functions use, so a changed signature leaves no stale
-- overload behind. Functions a migration object needs (a trigger, constraint, default, index), an
-- extension owns, or a migration created (by name, migrate_keep_functions) stay: the migrations
-- created them, not the function files, which need not repeat them.
DO $drop$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'respool' AND p.prokind IN ('f', 'p')
                AND NOT EXISTS (SELECT FROM pg_depend d
                                 WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = p.oid
                                   AND d.classid <> 'pg_proc'::regclass)
                AND NOT EXISTS (SELECT FROM pg_depend d
                                 WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                   AND d.deptype = 'e')
                AND p.proname <> ALL (string_to_array(
                        coalesce(current_setting('respool.migration_functions', true), ''), ','))
              ORDER BY p.oid DESC LOOP
        EXECUTE format('DROP ROUTINE IF EXISTS %s', f);
    END LOOP;
END
$drop$;
