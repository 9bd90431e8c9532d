-- Addressing pools and policies by name, full id or a unique id prefix (docs/api.md).

CREATE OR REPLACE FUNCTION respool._resolve_ref(p_kind text, p_ref text, p_ids uuid[], p_labels text[])
RETURNS uuid LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_ids) = 1 THEN
        RETURN p_ids[1];
    ELSIF cardinality(p_ids) > 1 THEN
        PERFORM respool._fail('RP400', p_kind, format('%s ref %L is ambiguous; candidates: %s',
                                                      p_kind, p_ref, array_to_string(p_labels, ', ')));
    END IF;
    PERFORM respool._fail('RP404', p_kind, format('%s %L not found', p_kind, p_ref));
    RETURN NULL;
END $$;
COMMENT ON FUNCTION respool._resolve_ref(text, text, uuid[], text[]) IS 'Turns the matches of a ref into one id, or RP404 (none) / RP400 listing the candidates (several).';

CREATE OR REPLACE FUNCTION respool.resolve_pool(p_ref text)
RETURNS uuid LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id uuid;
BEGIN
    -- A ref that cannot be an id prefix is a name, found by one probe of the unique index
    -- (PL/pgSQL keeps the plan; every create with a pool ref comes here).
    IF p_ref IS NULL OR p_ref !~* '^[0-9a-f-]{4,36}$' THEN
        SELECT id INTO v_id FROM respool.pools WHERE name = p_ref;
        IF NOT FOUND THEN
            PERFORM respool._fail('RP404', 'pool', format('pool %L not found', p_ref));
        END IF;
        RETURN v_id;
    END IF;
    -- A name match and an id-prefix match of another pool are ambiguous (docs/api.md), never
    -- resolved silently: candidates are every pool matching either way.
    RETURN (SELECT respool._resolve_ref('pool', p_ref, coalesce(array_agg(id ORDER BY name), '{}'),
                                        array_agg(name || ' (' || id || ')' ORDER BY name))
              FROM respool.pools
             WHERE name = p_ref OR id::text LIKE lower(p_ref) || '%');
END $$;
COMMENT ON FUNCTION respool.resolve_pool(text) IS 'Pool id for a name, a full id or a unique id prefix of >= 4 hex chars; RP400 listing the candidates when the ref is one pool''s name and another''s id prefix.';

CREATE OR REPLACE FUNCTION respool.resolve_policy(p_ref text)
RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT respool._resolve_ref('policy', p_ref, coalesce(array_agg(p.id ORDER BY p.id), '{}'),
                                array_agg(p.id || ' (' || p.subject || ' on ' || pl.name || ')' ORDER BY p.id))
      FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
     WHERE p_ref ~* '^[0-9a-f-]{4,36}$' AND p.id::text LIKE lower(p_ref) || '%'
$$;
COMMENT ON FUNCTION respool.resolve_policy(text) IS 'Policy id for a full id or a unique id prefix of >= 4 hex chars.';

CREATE OR REPLACE FUNCTION respool._lock_pools(p_pool_ids uuid[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM respool.pools WHERE id = ANY (p_pool_ids) ORDER BY id FOR NO KEY UPDATE;
    -- Rate keys (039_rates.sql): charges that left their window give their units back first.
    -- (the queue is granted first, in its order: a new request must not jump it)
    PERFORM respool._expire_charges(r.pool_id, p_grant => true)
       FROM (SELECT DISTINCT pool_id FROM respool.pool_rates WHERE pool_id = ANY (p_pool_ids)) r;
END $$;
COMMENT ON FUNCTION respool._lock_pools(uuid[]) IS
    'Locks pool rows in id order: the first step of every change that moves units, so no two transactions deadlock. Then takes the charges of rate keys that left their window off the counters and grants the queue what came back, in its order (respool._expire_charges).';

CREATE OR REPLACE FUNCTION respool.lock_pools(p_pool_ids uuid[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM respool._lock_pools(p_pool_ids);
END $$;
COMMENT ON FUNCTION respool.lock_pools(uuid[]) IS 'Public entry for callers outside SQL (a manifest apply): locks the given pool rows FOR NO KEY UPDATE in id order, the order every engine function uses, so the caller''s transaction cannot deadlock with them; unknown ids are ignored. Held until the transaction ends.';
