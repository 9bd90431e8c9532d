-- Errors, resource keys and amounts (the bounds are in 005_bounds_and_patterns.sql).
-- Expected failures RAISE with private SQLSTATEs that app/db/errors.py maps to HTTP codes:
--   RP400 bad input (COLUMN names the field), RP404 not found, RP409 conflict,
--   RP422 idempotency key reused with another body, RP500 an invariant would break (a bug).

CREATE OR REPLACE FUNCTION respool._fail(p_code text, p_field text, p_message text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = p_code, COLUMN = coalesce(p_field, '');
END $$;
COMMENT ON FUNCTION respool._fail(text, text, text) IS 'Raises an expected error: SQLSTATE p_code, the field in COLUMN, a one-line message.';

CREATE OR REPLACE FUNCTION respool._check_one_of(p_field text, p_value text, VARIADIC p_allowed text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NOT NULL AND p_value <> ALL (p_allowed) THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be %s', p_field, array_to_string(p_allowed, ' or ')));
    END IF;
END $$;
COMMENT ON FUNCTION respool._check_one_of(text, text, text[]) IS 'RP400 naming p_field ("<field> must be a or b") unless p_value is NULL or one of p_allowed.';

CREATE OR REPLACE FUNCTION respool._absent_object(p_value jsonb, p_field text, p_message text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN true;
    END IF;
    IF jsonb_typeof(p_value) <> 'object' THEN
        PERFORM respool._fail('RP400', p_field, p_message);
    END IF;
    RETURN false;
END $$;
COMMENT ON FUNCTION respool._absent_object(jsonb, text, text) IS 'The shared first check of an optional JSON object argument: true when absent (SQL or JSON null), false when an object; RP400 naming p_field with p_message otherwise.';

CREATE OR REPLACE FUNCTION respool._absent_map(p_map jsonb, p_field text, p_message text,
                                               p_label_keys boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_pattern text := CASE WHEN p_label_keys THEN respool._label_key_pattern() ELSE respool._key_pattern() END;
    v_bad text;
BEGIN
    IF respool._absent_object(p_map, p_field, p_message) THEN
        RETURN true;
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(p_map)) > respool._max_keys() THEN
        PERFORM respool._fail('RP400', p_field, format('%s has more than %s keys', p_field, respool._max_keys()));
    END IF;
    SELECT left(k, 70) INTO v_bad FROM jsonb_object_keys(p_map) k WHERE k !~ v_pattern ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', p_field || '.' || v_bad, format('%s: bad %s key %L (expected %s)',
            p_field, CASE WHEN p_label_keys THEN 'label' ELSE 'resource' END, v_bad, v_pattern));
    END IF;
    RETURN false;
END $$;
COMMENT ON FUNCTION respool._absent_map(jsonb, text, text, boolean) IS 'The shared shape check of a map argument keyed by resource keys (p_label_keys: label keys): true when absent (respool._absent_object, p_message when not an object); else at most respool._max_keys() keys, each matching its pattern (RP400 naming p_field, or p_field.key for the first bad key in key order), and false. The caller checks the values.';

CREATE OR REPLACE FUNCTION respool._is_soft_key(p_key text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_key IN ('mcpu', 'memory_mb', 'step_run')
$$;
COMMENT ON FUNCTION respool._is_soft_key(text) IS 'Soft keys are unbounded at a place (pool or node) that has no capacity for them (docs/admission.md, "Keys"); the key rule itself is respool._effective_capacity (029_capacity.sql).';

CREATE OR REPLACE FUNCTION respool._amount(p_value jsonb, p_field text, p_positive boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v numeric;
BEGIN
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number' THEN  -- SQL NULL too
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer', p_field));
    END IF;
    v := p_value::numeric;
    IF v <> trunc(v) THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer, got %s', p_field, v));
    END IF;
    IF v < 0 OR v > respool._max_amount() OR (p_positive AND v = 0) THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer between %s and %s, got %s',
                                                       p_field, CASE WHEN p_positive THEN 1 ELSE 0 END,
                                                       respool._max_amount(), left(v::text, 40)));
    END IF;
    RETURN v::bigint;
END $$;
COMMENT ON FUNCTION respool._amount(jsonb, text, boolean) IS 'Validates one amount: a JSON integer in [0, _max_amount()] (or [1, ...] when p_positive); RP400 naming the field otherwise. The bound keeps every sum of amounts within bigint.';

CREATE OR REPLACE FUNCTION respool._resource_map(p_map jsonb, p_field text, p_keep_zeros boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    result jsonb := '{}';
    n bigint;
BEGIN
    IF respool._absent_map(p_map, p_field, format('%s must be an object of key: integer', p_field)) THEN
        RETURN '{}';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_map) LOOP
        n := respool._amount(v, p_field || '.' || k);
        IF n > 0 OR p_keep_zeros THEN
            result := result || jsonb_build_object(k, n);
        END IF;
    END LOOP;
    RETURN result;
END $$;
COMMENT ON FUNCTION respool._resource_map(jsonb, text, boolean) IS 'Validates a {key: amount} map (key pattern, integer in [0, _max_amount()], at most _max_keys() keys); drops zeros unless p_keep_zeros (update merges, where 0 removes a key).';
