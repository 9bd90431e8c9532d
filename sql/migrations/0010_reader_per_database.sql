-- 0010_reader_per_database: one reader role per database (issue 15, defect 3).
-- respool_reader is a cluster-wide role, so a reader of one respool database could read the ops
-- views of every other respool database on the server. From now on the views of this database
-- are granted to a NOLOGIN role of its own, respool.reader_role() (respool_reader_<database>),
-- and respool_reader keeps no privilege here (sql/functions/090_reader.sql moves the grants on
-- every migrate). Existing readers of this database - members of respool_reader that
-- `respool db grant-reader` configured in it - become members of the new role.

CREATE FUNCTION respool.reader_role() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_database() ~ '^[a-z0-9_]{1,48}$'
                THEN 'respool_reader_' || current_database()
                ELSE 'respool_reader_'
                     || left(regexp_replace(lower(current_database()), '[^a-z0-9_]', '_', 'g'), 30)
                     || '_' || left(md5(current_database()), 8) END
$$;
COMMENT ON FUNCTION respool.reader_role() IS
    'The name of this database''s reader role: respool_reader_<database> (a plain lower-case name of up to 48 characters), otherwise a sanitized prefix plus an md5 suffix; always a valid name of at most 63 bytes, different for every database name. Never change: grants are made to this name.';

CREATE TABLE respool.reader_views (
    view text PRIMARY KEY
);
COMMENT ON TABLE respool.reader_views IS
    'The views this database''s reader role may SELECT: recorded from the view files'' GRANTs to respool_reader on every migrate, so that grant-reader can grant them later even when the migrating role could not create the reader role.';

DO $$
DECLARE
    v_role text := respool.reader_role();
    m record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = v_role) THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'cannot create role % (needs CREATEROLE): the ops views are readable by nobody until `respool db grant-reader` runs as a role that can', v_role;
            RETURN;
        END;
    END IF;
    FOR m IN SELECT r.rolname
               FROM pg_auth_members a
               JOIN pg_roles g ON g.oid = a.roleid AND g.rolname = 'respool_reader'
               JOIN pg_roles r ON r.oid = a.member
              WHERE EXISTS (SELECT FROM pg_db_role_setting s
                             WHERE s.setrole = r.oid
                               AND s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))
    LOOP
        BEGIN
            EXECUTE format('GRANT %I TO %I', v_role, m.rolname);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'cannot make % a member of % : run `respool db grant-reader %`', m.rolname, v_role, m.rolname;
        END;
    END LOOP;
END $$;
