-- The reader role of this database, and `respool db grant-reader ROLE` (docs/ops.md).
-- The ops views are granted to a NOLOGIN role of this database only,
-- respool.reader_role() (migration 0010), never to the cluster-wide respool_reader; a login role
-- reads them by being a member. Its limits are set on the member (settings of a role are not
-- inherited): a connection limit, temp_file_limit (superuser-only, so the member cannot lift
-- it), no TEMP on this database; statement_timeout and read-only transactions are defaults the
-- member can change itself (they are user-settable).

-- respool.reader_role() itself is migration 0010's: the pre-apply drop of a migrate keeps the
-- functions the migrations create (sql/queries/migrate_functions.sql), so it is not repeated here.

CREATE OR REPLACE FUNCTION respool.scope_reader_grants(p_record boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_role text := respool.reader_role();
    v_exists boolean := EXISTS (SELECT FROM pg_roles WHERE rolname = v_role);
    g record;
BEGIN
    IF p_record THEN
        -- Right after the view files ran (migrate): their GRANTs to respool_reader are the list.
        DELETE FROM respool.reader_views;
        INSERT INTO respool.reader_views (view)
        SELECT DISTINCT c.oid::regclass::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         CROSS JOIN LATERAL aclexplode(c.relacl) a
         WHERE n.nspname = 'respool' AND a.privilege_type = 'SELECT'
           AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = 'respool_reader');
    END IF;
    -- Every reader-like grant in this schema that is not this database's role goes: the
    -- cluster-wide respool_reader, and the role of a template this database was copied from.
    FOR g IN SELECT DISTINCT c.oid::regclass::text AS rel, r.rolname
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              CROSS JOIN LATERAL aclexplode(c.relacl) a
               JOIN pg_roles r ON r.oid = a.grantee
              WHERE n.nspname = 'respool'
                AND (r.rolname = 'respool_reader' OR r.rolname LIKE 'respool\_reader\_%')
                AND r.rolname <> v_role LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %I', g.rel, g.rolname);
    END LOOP;
    FOR g IN SELECT r.rolname FROM pg_roles r
              WHERE (r.rolname = 'respool_reader' OR r.rolname LIKE 'respool\_reader\_%')
                AND r.rolname <> v_role AND has_schema_privilege(r.oid, 'respool', 'USAGE') LOOP
        EXECUTE format('REVOKE ALL ON SCHEMA respool FROM %I', g.rolname);
    END LOOP;
    IF NOT v_exists THEN
        RETURN format('role %s does not exist: the ops views are readable by nobody (respool db grant-reader creates it)', v_role);
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA respool TO %I', v_role);
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), v_role);
    FOR g IN SELECT view FROM respool.reader_views WHERE to_regclass(view) IS NOT NULL LOOP
        EXECUTE format('GRANT SELECT ON %s TO %I', g.view, v_role);
    END LOOP;
    RETURN v_role;
END $$;
COMMENT ON FUNCTION respool.scope_reader_grants(boolean) IS 'Guarantees that the ops views of this database are readable by this database''s reader role (respool.reader_role(), when it exists: USAGE on the schema, CONNECT on the database, SELECT on the views listed in respool.reader_views) and by no other reader role: the cluster-wide respool_reader and the reader role of a template database lose every privilege here. p_record first re-records the list from the GRANTs to respool_reader that the view files just made (migrate). Returns the role name, or a sentence when the role does not exist.';

CREATE OR REPLACE FUNCTION respool.ensure_reader_role()
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_role text := respool.reader_role();
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = v_role) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
    END IF;
    PERFORM respool.scope_reader_grants();
    RETURN v_role;
END $$;
COMMENT ON FUNCTION respool.ensure_reader_role() IS 'Creates this database''s reader role when missing (needs CREATEROLE) and scopes the grants to it (scope_reader_grants); returns its name.';

DROP FUNCTION IF EXISTS respool.grant_reader(text, integer, boolean);
CREATE OR REPLACE FUNCTION respool.grant_reader(p_role text, p_statement_timeout_ms integer DEFAULT 30000,
                                                p_create boolean DEFAULT false,
                                                p_connection_limit integer DEFAULT 3,
                                                p_temp_file_limit_kb integer DEFAULT 102400)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_created boolean := false;
    v_reader text;
    v_temp_note text := '';
BEGIN
    -- TEMP is revoked from PUBLIC (the database owner keeps it), which is why owning the database
    -- is needed. Refusing roles that can use the base tables (the service's own role) keeps
    -- grant_reader from ever making the service read-only.
    IF p_role IS NULL OR p_role = '' THEN
        PERFORM respool._fail('RP400', 'role', 'role name is empty');
    ELSIF p_role LIKE 'respool\_reader%' OR p_role LIKE 'pg\_%' THEN
        PERFORM respool._fail('RP400', 'role', format('role %s cannot be made a reader', p_role));
    ELSIF p_statement_timeout_ms IS NULL OR p_statement_timeout_ms < 1 THEN
        PERFORM respool._fail('RP400', 'statement_timeout', 'statement timeout must be at least 1 ms');
    ELSIF p_connection_limit IS NULL OR p_connection_limit < 1 THEN
        PERFORM respool._fail('RP400', 'connection_limit', 'connection limit must be at least 1');
    ELSIF p_temp_file_limit_kb IS NULL OR p_temp_file_limit_kb < 0 THEN
        PERFORM respool._fail('RP400', 'temp_file_limit', 'temp file limit must be at least 0 kB');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = p_role) THEN
        IF NOT p_create THEN
            PERFORM respool._fail('RP404', 'role', format('role %s does not exist (use --create to create it)', p_role));
        END IF;
        EXECUTE format('CREATE ROLE %I LOGIN', p_role);
        v_created := true;
    ELSIF (SELECT rolsuper FROM pg_roles WHERE rolname = p_role)
          OR has_table_privilege(p_role, 'respool.requests', 'SELECT')
          OR has_table_privilege(p_role, 'respool.requests', 'UPDATE') THEN
        -- Setting a read-only default on the service's own role would break respool.
        PERFORM respool._fail('RP409', 'role', format(
            'role %s can already use respool''s tables (superuser, owner or granted); '
            'grant-reader is for roles that should only read the ops views', p_role));
    END IF;
    v_reader := respool.ensure_reader_role();
    EXECUTE format('GRANT %I TO %I', v_reader, p_role);
    -- Limits the member cannot lift: connections, temp files, temp tables.
    EXECUTE format('ALTER ROLE %I CONNECTION LIMIT %s', p_role, p_connection_limit);
    BEGIN
        EXECUTE format('ALTER ROLE %I IN DATABASE %I SET temp_file_limit = %L',
                       p_role, current_database(), p_temp_file_limit_kb || 'kB');
    EXCEPTION WHEN insufficient_privilege THEN
        v_temp_note := ' (temp_file_limit NOT set: only a superuser can set it)';
    END;
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM %I', current_database(), p_role);
    -- Defaults the member can change itself (user-settable).
    EXECUTE format('ALTER ROLE %I IN DATABASE %I SET statement_timeout = %L',
                   p_role, current_database(), p_statement_timeout_ms || 'ms');
    EXECUTE format('ALTER ROLE %I IN DATABASE %I SET default_transaction_read_only = on',
                   p_role, current_database());
    RETURN format('%s role %s: member of %s (this database only); %s connections; in database %s: '
                  'no TEMP, temp_file_limit %skB%s, statement_timeout %sms, read-only transactions by default',
                  CASE WHEN v_created THEN 'created' ELSE 'updated' END, p_role, v_reader,
                  p_connection_limit, current_database(), p_temp_file_limit_kb, v_temp_note,
                  p_statement_timeout_ms);
END $$;
COMMENT ON FUNCTION respool.grant_reader(text, integer, boolean, integer, integer) IS 'Makes p_role a member of this database''s reader role (respool.reader_role(): SELECT on the ops views only, created when missing) with a CONNECTION LIMIT and, in this database, a temp_file_limit (when the caller is a superuser), no TEMP privilege, a statement_timeout and default_transaction_read_only = on; creates it as a passwordless LOGIN role when p_create. Refuses superusers and roles that can already use the base tables. Needs CREATEROLE or superuser, and owning the database.';

CREATE OR REPLACE FUNCTION respool.revoke_reader(p_role text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_reader text := respool.reader_role();
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = p_role) THEN
        PERFORM respool._fail('RP404', 'role', format('role %s does not exist', p_role));
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = v_reader) THEN
        EXECUTE format('REVOKE %I FROM %I', v_reader, p_role);
    END IF;
    EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET statement_timeout', p_role, current_database());
    EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET default_transaction_read_only', p_role, current_database());
    EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET temp_file_limit', p_role, current_database());
    RETURN format('role %s: no longer a member of %s; settings in database %s reset (its connection limit stays)',
                  p_role, v_reader, current_database());
END $$;
COMMENT ON FUNCTION respool.revoke_reader(text) IS 'Undoes grant_reader in this database: revokes this database''s reader role from p_role and resets the settings grant_reader set here. The role and its connection limit stay.';
