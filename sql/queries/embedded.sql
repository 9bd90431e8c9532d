-- The embedded server's database (app/db/embedded.py; its name is embedded.DATABASE_NAME).

-- embedded_database_exists --
-- Whether database respool exists.
SELECT EXISTS (SELECT FROM pg_database WHERE datname = 'respool');

-- embedded_create_database --
-- Create database respool (cannot run in a transaction, so neither a function nor a DO block).
CREATE DATABASE respool;
