-- The ResourceSettings conversion (docs/admission.md, "ResourceSettings conversion"): settings
-- {gpu_count, cpu_count, memory, pool_resources} become resources {gpu, mcpu, memory_mb, ...},
-- server side, so every client agrees; build_resources merges them with raw resources.

CREATE OR REPLACE FUNCTION respool._memory_mb(p_memory jsonb)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m text[];
    bytes numeric;
BEGIN
    IF jsonb_typeof(p_memory) <> 'string' THEN
        PERFORM respool._fail('RP400', 'settings.memory', 'settings.memory must be a string like "8GB" or "16GiB"');
    END IF;
    m := regexp_match(p_memory #>> '{}', respool._memory_pattern());
    IF m IS NULL THEN
        PERFORM respool._fail('RP400', 'settings.memory', format(
            'settings.memory %s is not <number><unit> with unit K M G T P (KB .. PB) or Ki Mi Gi Ti Pi (KiB .. PiB)',
            left(p_memory::text, 70)));
    END IF;
    -- More than 24 integer digits is beyond the bound in any unit (10^24 KB = 10^21 MB), and
    -- would overflow numeric past 131072 digits: refuse it before the cast.
    IF length(split_part(ltrim(m[1], '0'), '.', 1)) > 24 THEN
        PERFORM respool._fail('RP400', 'settings.memory', format(
            'settings.memory is too large (at most %s MB)', respool._max_amount()));
    END IF;
    IF length(m[1]) > 1000 THEN  -- numeric takes at most 16383 decimal places
        PERFORM respool._fail('RP400', 'settings.memory', 'settings.memory has more than 1000 digits');
    END IF;
    -- K M G T P: powers of 1000 (8G = 8GB = 8 x 10^9 bytes, as in Kubernetes); with an i
    -- (Ki .. Pi, KiB .. PiB): powers of 1024. A trailing B changes nothing.
    bytes := m[1]::numeric * CASE WHEN m[2] LIKE '_i%' THEN 1024::numeric ELSE 1000::numeric END
                             ^ strpos('KMGTP', left(m[2], 1));
    IF ceil(bytes / 1e6) > respool._max_amount() THEN
        PERFORM respool._fail('RP400', 'settings.memory', format(
            'settings.memory is too large (at most %s MB)', respool._max_amount()));
    END IF;
    RETURN ceil(bytes / 1e6)::bigint;
END $$;
COMMENT ON FUNCTION respool._memory_mb(jsonb) IS 'Parses "<number><unit>" (K..P and KB..PB powers of 1000, Ki..Pi and KiB..PiB powers of 1024) into ceil(bytes / 1,000,000) MB, at most _max_amount(); RP400 naming settings.memory otherwise.';

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
        IF k NOT IN ('gpu_count', 'cpu_count', 'memory', 'pool_resources', 'gpu_type', 'gpu_class') THEN
            PERFORM respool._fail('RP400', 'settings.' || left(k, 70), format(
                'settings.%s is not a ResourceSettings field (gpu_count, cpu_count, memory, pool_resources, gpu_type, gpu_class)',
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
        IF cpu > respool._max_amount() THEN
            PERFORM respool._fail('RP400', 'settings.cpu_count', format(
                'settings.cpu_count is too large (at most %s CPUs)', respool._max_amount() / 1000));
        END IF;
        result := result || jsonb_build_object('mcpu', cpu::bigint);
    END IF;
    IF p_settings ? 'memory' AND p_settings -> 'memory' <> 'null'::jsonb THEN
        result := result || jsonb_build_object('memory_mb', respool._memory_mb(p_settings -> 'memory'));
    END IF;
    RETURN result;
END $$;
COMMENT ON FUNCTION respool.settings_to_resources(jsonb) IS 'The one ResourceSettings conversion (docs/admission.md, "ResourceSettings conversion"): gpu_count -> gpu, cpu_count -> mcpu (decimal ceil), memory -> memory_mb; typed fields override pool_resources. gpu_type and gpu_class are node labels, not resources (respool.build_node_selector).';

CREATE OR REPLACE FUNCTION respool._label_map(p_map jsonb, p_field text, p_allow_null boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF respool._absent_map(p_map, p_field, p_field || ' must be an object of label: string', true) THEN
        RETURN '{}';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_map) ORDER BY 1 LOOP
        CONTINUE WHEN p_allow_null AND jsonb_typeof(v) = 'null';
        IF jsonb_typeof(v) <> 'string' THEN
            PERFORM respool._fail('RP400', p_field || '.' || k, format('%s.%s must be a string', p_field, k));
        END IF;
        IF (v #>> '{}') !~ respool._label_value_pattern() THEN
            PERFORM respool._fail('RP400', p_field || '.' || k, format(
                '%s.%s must be at most 63 printable characters', p_field, k));
        END IF;
    END LOOP;
    RETURN p_map;
END $$;
COMMENT ON FUNCTION respool._label_map(jsonb, text, boolean) IS 'Validates a map of node labels (a node''s labels, a request''s node selector; docs/placement.md): label keys match respool._label_key_pattern(), values are strings of at most 63 printable characters (p_allow_null: a null value passes, an update removing the label), at most _max_keys() entries. RP400 naming p_field.<key>. NULL or JSON null: {}.';

CREATE OR REPLACE FUNCTION respool.build_node_selector(p_selector jsonb, p_settings jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_typed jsonb := '{}';
BEGIN
    IF p_settings IS NOT NULL AND jsonb_typeof(p_settings) = 'object' THEN
        SELECT coalesce(jsonb_object_agg(CASE f.field WHEN 'gpu_type' THEN 'gpu-type' ELSE 'gpu-class' END,
                                         p_settings -> f.field), '{}')
          INTO v_typed
          FROM unnest(ARRAY['gpu_type', 'gpu_class']) f(field)
         WHERE p_settings ? f.field AND p_settings -> f.field <> 'null'::jsonb;
        PERFORM respool._label_map(v_typed, 'settings');
    END IF;
    RETURN respool._label_map(p_selector, 'node_selector') || v_typed;
END $$;
COMMENT ON FUNCTION respool.build_node_selector(jsonb, jsonb) IS 'A request''s final node selector (docs/placement.md): node_selector merged with the settings gpu_type -> label gpu-type and gpu_class -> label gpu-class (settings win, as the typed settings fields do for resources); {} when none. RP400 naming the field for a bad label or value.';

CREATE OR REPLACE FUNCTION respool._check_slices(p_resources jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    n bigint;
    d text;
BEGIN
    -- A slice of one device of key K (docs/placement.md, "Sharing a GPU"): <K>_memory_mb, and
    -- optionally <K>_share (1..100); never with whole devices of K.
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_resources)
                 WHERE key ~ '^[a-z][a-z0-9_]*_share$' ORDER BY key LOOP
        d := left(k, -length('_share'));
        IF NOT p_resources ? (d || '_memory_mb') THEN
            PERFORM respool._fail('RP400', 'resources.' || d || '_memory_mb', format(
                'resources.%s_memory_mb is required with resources.%s: a slice of one %s device asks its memory (MiB)',
                d, k, d));
        END IF;
        IF n > 100 THEN
            PERFORM respool._fail('RP400', 'resources.' || k, format(
                'resources.%s must be a compute share from 1 to 100 (percent of one device), got %s', k, n));
        END IF;
    END LOOP;
    FOR d IN SELECT s.key FROM respool._slice_needs(p_resources) s ORDER BY s.key LOOP
        IF p_resources ? d THEN
            PERFORM respool._fail('RP400', 'resources.' || d || '_memory_mb', format(
                'resources: ask either whole %s devices (%s) or one slice of a device (%s_memory_mb, %s_share), not both',
                d, d, d, d));
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._check_slices(jsonb) IS
    'A request''s slices (docs/placement.md, "Sharing a GPU"), zeros already dropped: <K>_share needs <K>_memory_mb and is at most 100; <K>_memory_mb never comes with whole devices <K>. RP400 naming resources.<key>.';

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
    PERFORM respool._check_slices(merged);
    RETURN merged || '{"step_run": 1}'::jsonb;
END $$;
COMMENT ON FUNCTION respool.build_resources(jsonb, jsonb) IS 'Final request map: resources merged with converted settings (settings win), zeros dropped, step_run: 1 added; RP400 if the client sent step_run, or for a slice asked wrong (respool._check_slices).';
