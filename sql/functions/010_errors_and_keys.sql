-- Errors and resource maps.
-- Expected failures RAISE with private SQLSTATEs that app/db/errors.py maps to HTTP codes:
--   RP400 bad input (COLUMN names the field), RP404 not found, RP409 conflict,
--   RP422 idempotency key reused with another body, RP500 an invariant would break (a bug).

CREATE OR REPLACE FUNCTION respool._fail(p_code text, p_field text, p_message text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = p_code, COLUMN = coalesce(p_field, '');
END $$;
COMMENT ON FUNCTION respool._fail(text, text, text) IS
    'Raises an expected error: SQLSTATE p_code, the field in COLUMN, a one-line message.';

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
COMMENT ON FUNCTION respool._absent_object(jsonb, text, text) IS
    'The shared first check of an optional JSON object argument: true when absent (SQL or JSON null), false when an object; RP400 naming p_field with p_message otherwise.';

CREATE OR REPLACE FUNCTION respool._is_soft_key(p_key text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_key IN ('mcpu', 'memory_mb', 'step_run')
$$;
COMMENT ON FUNCTION respool._is_soft_key(text) IS
    'Soft keys are unbounded at the pool layer when the pool has no capacity row for them (SPEC §1).';

CREATE OR REPLACE FUNCTION respool._effective_capacity(p_key text, p_capacity bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_capacity IS NOT NULL THEN p_capacity
                WHEN respool._is_soft_key(p_key) THEN NULL
                ELSE 0 END
$$;
COMMENT ON FUNCTION respool._effective_capacity(text, bigint) IS
    'Capacity the admission rules use: NULL means untracked (unbounded); a missing non-soft key is 0.';

CREATE OR REPLACE FUNCTION respool._amount(p_value jsonb, p_field text, p_positive boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v numeric;
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) <> 'number' THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer', p_field));
    END IF;
    v := p_value::numeric;
    IF v <> trunc(v) THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer, got %s', p_field, v));
    END IF;
    IF v < 0 OR v > 9223372036854775807 OR (p_positive AND v = 0) THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer between %s and 2^63-1, got %s',
                                                       p_field, CASE WHEN p_positive THEN 1 ELSE 0 END, v));
    END IF;
    RETURN v::bigint;
END $$;
COMMENT ON FUNCTION respool._amount(jsonb, text, boolean) IS
    'Validates one amount: a JSON integer in [0, 2^63-1] (or [1, ...] when p_positive); RP400 naming the field otherwise.';

CREATE OR REPLACE FUNCTION respool._resource_map(p_map jsonb, p_field text, p_keep_zeros boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    result jsonb := '{}';
    n bigint;
BEGIN
    IF respool._absent_object(p_map, p_field, format('%s must be an object of key: integer', p_field)) THEN
        RETURN '{}';
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(p_map)) > 64 THEN
        PERFORM respool._fail('RP400', p_field, format('%s has more than 64 keys', p_field));
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_map) LOOP
        IF k !~ '^[a-z][a-z0-9_]{0,62}$' THEN
            PERFORM respool._fail('RP400', p_field || '.' || left(k, 70),
                format('%s: bad resource key %L (expected ^[a-z][a-z0-9_]{0,62}$)', p_field, left(k, 70)));
        END IF;
        n := respool._amount(v, p_field || '.' || k);
        IF n > 0 OR p_keep_zeros THEN
            result := result || jsonb_build_object(k, n);
        END IF;
    END LOOP;
    RETURN result;
END $$;
COMMENT ON FUNCTION respool._resource_map(jsonb, text, boolean) IS
    'Validates a {key: amount} map (key pattern, integer >= 0, at most 64 keys); drops zeros unless p_keep_zeros (update merges, where 0 removes a key).';

CREATE OR REPLACE FUNCTION respool._memory_mb(p_memory jsonb)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m text[];
    bytes numeric;
BEGIN
    IF jsonb_typeof(p_memory) <> 'string' THEN
        PERFORM respool._fail('RP400', 'settings.memory', 'settings.memory must be a string like "8GB" or "16GiB"');
    END IF;
    m := regexp_match(p_memory #>> '{}', '^\s*([0-9]+(?:\.[0-9]+)?)\s*(KB|MB|GB|TB|PB|KiB|MiB|GiB|TiB|PiB)\s*$');
    IF m IS NULL THEN
        PERFORM respool._fail('RP400', 'settings.memory', format(
            'settings.memory %s is not <number><unit> with unit KB MB GB TB PB KiB MiB GiB TiB PiB',
            p_memory));
    END IF;
    bytes := m[1]::numeric * CASE m[2]
        WHEN 'KB' THEN 1e3 WHEN 'MB' THEN 1e6 WHEN 'GB' THEN 1e9 WHEN 'TB' THEN 1e12 WHEN 'PB' THEN 1e15
        WHEN 'KiB' THEN 1024::numeric WHEN 'MiB' THEN 1024::numeric ^ 2 WHEN 'GiB' THEN 1024::numeric ^ 3
        WHEN 'TiB' THEN 1024::numeric ^ 4 ELSE 1024::numeric ^ 5 END;
    IF ceil(bytes / 1e6) > 9223372036854775807 THEN
        PERFORM respool._fail('RP400', 'settings.memory', 'settings.memory is too large');
    END IF;
    RETURN ceil(bytes / 1e6)::bigint;
END $$;
COMMENT ON FUNCTION respool._memory_mb(jsonb) IS
    'Parses "<number><unit>" (KB..PB powers of 1000, KiB..PiB powers of 1024) into ceil(bytes / 1,000,000) MB.';

CREATE OR REPLACE FUNCTION respool.settings_to_resources(p_settings jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    cpu numeric;
    result jsonb;
BEGIN
    IF respool._absent_object(p_settings, 'settings', 'settings must be an object') THEN
        RETURN '{}';
    END IF;
    FOR k IN SELECT jsonb_object_keys(p_settings) LOOP
        IF k NOT IN ('gpu_count', 'cpu_count', 'memory', 'pool_resources') THEN
            PERFORM respool._fail('RP400', 'settings.' || left(k, 70), format(
                'settings.%s is not a ResourceSettings field (gpu_count, cpu_count, memory, pool_resources)',
                left(k, 70)));
        END IF;
    END LOOP;
    result := respool._resource_map(p_settings -> 'pool_resources', 'settings.pool_resources');
    IF p_settings ? 'gpu_count' AND p_settings -> 'gpu_count' <> 'null'::jsonb THEN
        result := result || jsonb_build_object('gpu', respool._amount(p_settings -> 'gpu_count', 'settings.gpu_count'));
    END IF;
    IF p_settings ? 'cpu_count' AND p_settings -> 'cpu_count' <> 'null'::jsonb THEN
        IF jsonb_typeof(p_settings -> 'cpu_count') <> 'number' OR (p_settings ->> 'cpu_count')::numeric < 0 THEN
            PERFORM respool._fail('RP400', 'settings.cpu_count', 'settings.cpu_count must be a number >= 0');
        END IF;
        -- jsonb keeps the decimal as written, so 8.05 * 1000 is exactly 8050.
        cpu := ceil((p_settings ->> 'cpu_count')::numeric * 1000);
        IF cpu > 9223372036854775807 THEN
            PERFORM respool._fail('RP400', 'settings.cpu_count', 'settings.cpu_count is too large');
        END IF;
        result := result || jsonb_build_object('mcpu', cpu::bigint);
    END IF;
    IF p_settings ? 'memory' AND p_settings -> 'memory' <> 'null'::jsonb THEN
        result := result || jsonb_build_object('memory_mb', respool._memory_mb(p_settings -> 'memory'));
    END IF;
    RETURN result;
END $$;
COMMENT ON FUNCTION respool.settings_to_resources(jsonb) IS
    'The one ResourceSettings conversion (SPEC §1): gpu_count -> gpu, cpu_count -> mcpu (decimal ceil), memory -> memory_mb; typed fields override pool_resources.';

CREATE OR REPLACE FUNCTION respool.build_resources(p_resources jsonb, p_settings jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    merged jsonb;
BEGIN
    IF (p_resources IS NOT NULL AND p_resources ? 'step_run')
       OR (p_settings IS NOT NULL AND jsonb_typeof(p_settings) = 'object'
           AND jsonb_typeof(p_settings -> 'pool_resources') = 'object'
           AND p_settings -> 'pool_resources' ? 'step_run') THEN
        PERFORM respool._fail('RP400', 'resources.step_run', 'step_run is added by the server (always 1); do not send it');
    END IF;
    merged := respool._resource_map(p_resources, 'resources') || respool.settings_to_resources(p_settings);
    SELECT coalesce(jsonb_object_agg(key, value), '{}') INTO merged
      FROM jsonb_each(merged) WHERE value <> '0'::jsonb;
    RETURN merged || '{"step_run": 1}'::jsonb;
END $$;
COMMENT ON FUNCTION respool.build_resources(jsonb, jsonb) IS
    'Final request map: resources merged with converted settings (settings win), zeros dropped, step_run: 1 added; RP400 if the client sent step_run.';
