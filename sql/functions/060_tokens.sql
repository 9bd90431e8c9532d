-- API tokens (docs/api.md, leases Auth): create, verify, list, revoke. Callers pass the sha256 hex of a
-- token, never the token itself, so the plaintext never reaches the database (or its logs).

CREATE OR REPLACE FUNCTION respool.token_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('id', t.id, 'name', t.name, 'role', t.role,
                              'subject_patterns', to_jsonb(t.subject_patterns),
                              'created_at', t.created_at, 'revoked_at', t.revoked_at,
                              -- an agent token's binding (docs/jobs.md)
                              -- (node_id: the node of that name now, NULL while none is registered)
                              'node', t.node_name, 'node_id', (SELECT n.id FROM respool.nodes n WHERE n.name = t.node_name),
                              'pool', (SELECT p.name FROM respool.pools p WHERE p.id = t.pool_id), 'pool_id', t.pool_id)
      FROM respool.tokens t WHERE t.id = p_id
$$;
COMMENT ON FUNCTION respool.token_json(uuid) IS 'A token as shown to admins: everything but its hash.';

CREATE OR REPLACE FUNCTION respool._agent_binding(p_node text, p_pool text, OUT node_name text, OUT pool_id uuid)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_node respool.nodes;
BEGIN
    IF p_node IS NULL THEN
        IF p_pool IS NULL THEN
            PERFORM respool._fail('RP400', 'node', 'an agent token is bound to exactly one node, or to one pool without nodes');
        END IF;
        pool_id := respool.resolve_pool(p_pool);
        IF respool._pool_has_nodes(pool_id) THEN
            PERFORM respool._fail('RP400', 'pool', format(
                'pool %s has nodes: bind the agent token to one of its nodes (--node)', p_pool));
        END IF;
        RETURN;
    END IF;
    IF p_node !~ respool._pool_name_pattern() THEN
        PERFORM respool._fail('RP400', 'node', 'node must match ' || respool._pool_name_pattern());
    END IF;
    node_name := p_node;
    SELECT * INTO v_node FROM respool.nodes n WHERE n.name = p_node;
    IF v_node.id IS NULL THEN
        IF p_pool IS NULL THEN
            PERFORM respool._fail('RP400', 'pool', format(
                'pool must name where the agent registers node %s, which is not registered yet', p_node));
        END IF;
        pool_id := respool.resolve_pool(p_pool);
    ELSE
        pool_id := v_node.pool_id;
        IF p_pool IS NOT NULL AND respool.resolve_pool(p_pool) IS DISTINCT FROM pool_id THEN
            PERFORM respool._fail('RP409', 'node', format('node %s is in %s, not in pool %s', p_node,
                coalesce('pool ' || (SELECT p.name FROM respool.pools p WHERE p.id = pool_id), 'no pool'), p_pool));
        END IF;
    END IF;
END $$;
COMMENT ON FUNCTION respool._agent_binding(text, text) IS
    'The binding of a new agent token: node p_node by name (it need not exist) and the pool its agent may create it in (an existing node''s pool, which p_pool must name; else p_pool, required), or pool p_pool without nodes. RP400/RP404/RP409 naming the field.';

DROP FUNCTION IF EXISTS respool.create_token(text, text, text, text[]);
CREATE OR REPLACE FUNCTION respool.create_token(p_name text, p_role text, p_token_hash text,
                                                p_subject_patterns text[] DEFAULT NULL,
                                                p_node text DEFAULT NULL, p_pool text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_pattern text;
    v_node text;
    v_pool uuid;
BEGIN
    IF p_name IS NULL OR p_name !~ respool._subject_pattern() THEN
        PERFORM respool._fail('RP400', 'name', 'name must be 1-128 characters of A-Z a-z 0-9 _ . : / @ -, starting with a letter or digit');
    END IF;
    IF p_role IS NULL OR p_role NOT IN ('admin', 'client', 'reader', 'agent') THEN
        PERFORM respool._fail('RP400', 'role', 'role must be admin, client, reader or agent');
    END IF;
    -- An agent token is bound to one node by name, or to one pool without nodes (docs/jobs.md).
    IF p_role = 'agent' THEN
        SELECT b.node_name, b.pool_id INTO v_node, v_pool FROM respool._agent_binding(p_node, p_pool) b;
    ELSIF p_node IS NOT NULL OR p_pool IS NOT NULL THEN
        PERFORM respool._fail('RP400', 'node', 'only agent tokens are bound to a node or pool');
    END IF;
    IF p_token_hash IS NULL OR p_token_hash !~ '^[0-9a-f]{64}$' THEN
        PERFORM respool._fail('RP400', 'token_hash', 'token_hash must be a lower-case hex sha256');
    END IF;
    IF p_role = 'client' THEN
        IF p_subject_patterns IS NULL OR cardinality(p_subject_patterns) = 0 THEN
            PERFORM respool._fail('RP400', 'subject_patterns', 'a client token needs at least one subject pattern');
        END IF;
        FOREACH v_pattern IN ARRAY p_subject_patterns LOOP
            IF v_pattern IS NULL OR v_pattern !~ '^[A-Za-z0-9_.:/@*?-]{1,128}$' THEN
                PERFORM respool._fail('RP400', 'subject_patterns',
                    format('subject pattern %L: use subject characters plus * and ?', v_pattern));
            END IF;
        END LOOP;
    ELSIF p_subject_patterns IS NOT NULL THEN
        PERFORM respool._fail('RP400', 'subject_patterns', 'only client tokens take subject patterns');
    END IF;
    IF EXISTS (SELECT FROM respool.tokens WHERE name = p_name AND revoked_at IS NULL) THEN
        PERFORM respool._fail('RP409', 'name', format('a token named %L already exists', p_name));
    END IF;
    IF EXISTS (SELECT FROM respool.tokens WHERE token_hash = p_token_hash) THEN
        PERFORM respool._fail('RP409', 'token_hash', 'this token is already registered');
    END IF;
    INSERT INTO respool.tokens (name, role, subject_patterns, token_hash, node_name, pool_id)
    VALUES (p_name, p_role, CASE WHEN p_role = 'client' THEN p_subject_patterns END, p_token_hash, v_node, v_pool)
    RETURNING id INTO v_id;
    RETURN respool.token_json(v_id);
END $$;
COMMENT ON FUNCTION respool.create_token(text, text, text, text[], text, text) IS 'Registers a token by its sha256 hex (RP400 bad input, RP409 name in use or hash known); an agent token is bound to node p_node by name, or to pool p_pool without nodes (respool._agent_binding); returns it without the hash.';

CREATE OR REPLACE FUNCTION respool.verify_token(p_token_hash text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT respool.token_json(t.id) FROM respool.tokens t
     WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
$$;
COMMENT ON FUNCTION respool.verify_token(text) IS 'The active token with this sha256 hex, or NULL when unknown or revoked.';

CREATE OR REPLACE FUNCTION respool.tokens_exist()
RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT EXISTS (SELECT FROM respool.tokens) $$;
COMMENT ON FUNCTION respool.tokens_exist() IS 'Whether any token was ever created (revoked ones count): ends the loopback bootstrap mode of the API.';

CREATE OR REPLACE FUNCTION respool.list_tokens(p_include_revoked boolean DEFAULT false)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(respool.token_json(id) ORDER BY created_at, id), '[]')
      FROM respool.tokens WHERE p_include_revoked OR revoked_at IS NULL
$$;
COMMENT ON FUNCTION respool.list_tokens(boolean) IS 'Tokens, oldest first, without hashes; revoked ones only on request.';

CREATE OR REPLACE FUNCTION respool.revoke_token(p_ref text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    IF p_ref ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        SELECT id INTO v_id FROM respool.tokens WHERE id = p_ref::uuid;
    END IF;
    IF v_id IS NULL THEN
        SELECT id INTO v_id FROM respool.tokens WHERE name = p_ref AND revoked_at IS NULL;
    END IF;
    IF v_id IS NULL THEN
        PERFORM respool._fail('RP404', 'token', format('token %s not found', p_ref));
    END IF;
    UPDATE respool.tokens SET revoked_at = now() WHERE id = v_id AND revoked_at IS NULL;
    RETURN respool.token_json(v_id);
END $$;
COMMENT ON FUNCTION respool.revoke_token(text) IS 'Revokes a token by id or by the name of an active token (RP404); revoking twice keeps the first revoked_at.';

CREATE OR REPLACE FUNCTION respool.request_subject(p_id uuid)
RETURNS text LANGUAGE sql STABLE AS $$ SELECT subject FROM respool.requests WHERE id = p_id $$;
COMMENT ON FUNCTION respool.request_subject(uuid) IS 'The subject of a request, or NULL when there is none: lets the API scope a client token cheaply.';
