-- respool_reader membership for login roles (`respool db grant-reader ROLE`, docs/ops.md).
-- respool_reader itself (0001_init) is NOLOGIN, with SELECT on the ops views only. Settings of a
-- role are not inherited by its members, so the statement timeout and the read-only default are
-- set on the member role, for this database only.

CREATE OR REPLACE FUNCTION respool.grant_reader(p_role text, p_statement_timeout_ms integer DEFAULT 30000,
                                                p_create boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_created boolean := false;
BEGIN
    IF p_role IS NULL OR p_role = '' THEN
        PERFORM respool._fail('RP400', 'role', 'role name is empty');
    ELSIF p_role = 'respool_reader' OR p_role LIKE 'pg\_%' THEN
        PERFORM respool._fail('RP400', 'role', format('role %s cannot be made a reader', p_role));
    ELSIF p_statement_timeout_ms IS NULL OR p_statement_timeout_ms < 1 THEN
        PERFORM respool._fail('RP400', 'statement_timeout', 'statement timeout must be at least 1 ms');
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
    EXECUTE format('GRANT respool_reader TO %I', p_role);
    EXECUTE format('ALTER ROLE %I IN DATABASE %I SET statement_timeout = %L',
                   p_role, current_database(), p_statement_timeout_ms || 'ms');
    EXECUTE format('ALTER ROLE %I IN DATABASE %I SET default_transaction_read_only = on',
                   p_role, current_database());
    RETURN format('%s role %s: member of respool_reader; in database %s: statement_timeout %sms, read-only transactions by default',
                  CASE WHEN v_created THEN 'created' ELSE 'updated' END, p_role, current_database(),
                  p_statement_timeout_ms);
END $$;
COMMENT ON FUNCTION respool.grant_reader(text, integer, boolean) IS
    'Makes p_role a member of respool_reader (SELECT on the ops views only) and sets, for this database, its statement_timeout and default_transaction_read_only = on. Creates it as a LOGIN role without password when p_create. Refuses superusers and roles that can already use the base tables (the service''s own role), so it never makes the service read-only. Needs CREATEROLE (and ADMIN on respool_reader) or superuser.';

CREATE OR REPLACE FUNCTION respool.revoke_reader(p_role text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = p_role) THEN
        PERFORM respool._fail('RP404', 'role', format('role %s does not exist', p_role));
    END IF;
    EXECUTE format('REVOKE respool_reader FROM %I', p_role);
    EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET statement_timeout', p_role, current_database());
    EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET default_transaction_read_only', p_role, current_database());
    RETURN format('role %s: no longer a member of respool_reader; settings in database %s reset',
                  p_role, current_database());
END $$;
COMMENT ON FUNCTION respool.revoke_reader(text) IS
    'Undoes grant_reader: revokes respool_reader from p_role and resets the two settings grant_reader set in this database. The role itself stays.';
