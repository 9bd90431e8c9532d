-- The migration runner's bookkeeping (app/db/migrate.py). Migration, function and view files
-- themselves are executed as files.

-- migrate_lock --
-- Serialize migrators on this database (session-level advisory lock, key $1).
SELECT pg_advisory_lock($1);

-- migrate_unlock --
-- Release the migrators' advisory lock.
SELECT pg_advisory_unlock($1);

-- migrate_bookkeeping --
-- Create the schema and the two bookkeeping tables when missing.
DO $$
BEGIN
    CREATE SCHEMA IF NOT EXISTS respool;
    CREATE TABLE IF NOT EXISTS respool.schema_migrations (
        version    int PRIMARY KEY,
        name       text NOT NULL,
        checksum   text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE IF NOT EXISTS respool.schema_repeatables (
        path       text PRIMARY KEY,
        checksum   text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    );
END $$;

-- migrate_bookkeeping_exists --
-- Whether both bookkeeping tables exist.
SELECT to_regclass('respool.schema_migrations') IS NOT NULL
       AND to_regclass('respool.schema_repeatables') IS NOT NULL;

-- migrate_applied_migrations --
-- The applied migrations with their checksums.
SELECT version, name, checksum FROM respool.schema_migrations;

-- migrate_applied_repeatables --
-- The applied repeatable files with their checksums.
SELECT path, checksum FROM respool.schema_repeatables;

-- migrate_record_migration --
-- Record one applied migration.
INSERT INTO respool.schema_migrations (version, name, checksum) VALUES ($1, $2, $3);

-- migrate_drop_views --
-- Drop every view in schema respool (names quoted with %I; CASCADE may drop some earlier).
DO $$
DECLARE
    v name;
BEGIN
    FOR v IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'respool' AND c.relkind = 'v' LOOP
        EXECUTE format('DROP VIEW IF EXISTS respool.%I CASCADE', v);
    END LOOP;
END $$;

-- migrate_forget_repeatables --
-- Forget every recorded repeatable (they are about to be recorded again).
DELETE FROM respool.schema_repeatables;

-- migrate_record_repeatable --
-- Record one applied repeatable file.
INSERT INTO respool.schema_repeatables (path, checksum) VALUES ($1, $2);
