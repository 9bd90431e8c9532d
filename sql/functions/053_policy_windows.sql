-- Policies over time (docs/preemption.md, "Time windows"): a policy's reserved share is in force
-- only inside its windows. Weekly windows ({timezone, days, from, to}) are read in their own time
-- zone, one local date at a time, so daylight saving time moves them in UTC; one-time windows
-- ({start, end}) are two instants. Every window is half open: active from its start, inactive
-- again at its end. Everything here that depends on time takes the clock as p_now.

CREATE OR REPLACE FUNCTION respool._weekdays()
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT ARRAY['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'] $$;
COMMENT ON FUNCTION respool._weekdays() IS 'The day names of a weekly window, in ISO order (index = ISO day of week).';

CREATE OR REPLACE FUNCTION respool._iso_utc(p_ts timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(to_char(p_ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '\.?0*$', '') || 'Z'
$$;
COMMENT ON FUNCTION respool._iso_utc(timestamptz) IS 'An instant as ISO 8601 in UTC (2026-03-30T07:00:00Z; fractional seconds only when there are some), independent of the session''s time zone.';

CREATE OR REPLACE FUNCTION respool._window_instant(p_value jsonb, p_field text)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_text text;
BEGIN
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'string' THEN  -- SQL NULL too
        PERFORM respool._fail('RP400', p_field, p_field || ' is required: a timestamp with a UTC offset, e.g. 2026-03-01T00:00:00Z');
    END IF;
    v_text := p_value #>> '{}';
    -- An offset is required: a bare local time would depend on the server's time zone.
    IF v_text !~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?([Zz]|[+-]\d{2}(:?\d{2})?)$' THEN
        PERFORM respool._fail('RP400', p_field, format(
            '%s must be a timestamp with a UTC offset, e.g. 2026-03-01T00:00:00Z (got %s)', p_field, left(v_text, 64)));
    END IF;
    BEGIN
        RETURN v_text::timestamptz;
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format OR invalid_time_zone_displacement_value THEN
        PERFORM respool._fail('RP400', p_field, format('%s is not a valid timestamp (got %s)', p_field, left(v_text, 64)));
    END;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION respool._window_instant(jsonb, text) IS 'The instant of a one-time window''s start or end: a JSON string with a date, a time and a UTC offset; RP400 naming p_field otherwise.';

CREATE OR REPLACE FUNCTION respool._window_hhmm(p_value jsonb, p_field text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) <> 'string' OR (p_value #>> '{}') !~ respool._hhmm_pattern() THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be a time of day HH:MM (00:00 to 23:59)', p_field));
    END IF;
    RETURN p_value #>> '{}';
END $$;
COMMENT ON FUNCTION respool._window_hhmm(jsonb, text) IS 'A weekly window''s from / to: HH:MM (respool._hhmm_pattern); RP400 naming p_field otherwise.';

CREATE OR REPLACE FUNCTION respool._windows(p_windows jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_out jsonb := '[]';
    v_item jsonb;
    v_i integer := 0;
    v_field text;
    v_key text;
    v_days text[];
    v_day jsonb;
    v_start timestamptz;
    v_end timestamptz;
    v_weekly constant text[] := ARRAY['timezone', 'days', 'from', 'to'];
    v_once constant text[] := ARRAY['start', 'end'];
    v_zones text[] := '{}';      -- the weekly windows' time zones ...
    v_zones_at integer[] := '{}';  -- ... and their indexes
    v_bad record;
BEGIN
    IF p_windows IS NULL OR p_windows = 'null'::jsonb THEN
        RETURN NULL;  -- always active
    END IF;
    IF jsonb_typeof(p_windows) <> 'array' THEN
        PERFORM respool._fail('RP400', 'windows', 'windows must be a list of windows, or null (always active)');
    END IF;
    IF jsonb_array_length(p_windows) = 0 THEN
        PERFORM respool._fail('RP400', 'windows',
                              'windows must hold at least one window; null (not an empty list) means always active');
    END IF;
    IF jsonb_array_length(p_windows) > respool._max_windows() THEN
        PERFORM respool._fail('RP400', 'windows', format('a policy has at most %s windows', respool._max_windows()));
    END IF;
    FOR v_item IN SELECT e FROM jsonb_array_elements(p_windows) e LOOP
        v_field := format('windows[%s]', v_i);
        IF jsonb_typeof(v_item) <> 'object' THEN
            PERFORM respool._fail('RP400', v_field, v_field || ' must be an object: {timezone, days, from, to} or {start, end}');
        END IF;
        SELECT k INTO v_key FROM jsonb_object_keys(v_item) k WHERE k <> ALL (v_weekly || v_once) ORDER BY k LIMIT 1;
        IF FOUND THEN
            PERFORM respool._fail('RP400', v_field || '.' || v_key, format(
                '%s.%s: unknown field (a weekly window has timezone, days, from, to; a one-time window has start, end)',
                v_field, v_key));
        END IF;
        IF v_item ?| v_weekly AND v_item ?| v_once THEN
            PERFORM respool._fail('RP400', v_field, v_field
                || ' is either weekly (timezone, days, from, to) or one time (start, end), not both');
        END IF;
        IF v_item ?| v_once THEN
            v_start := respool._window_instant(v_item -> 'start', v_field || '.start');
            v_end := respool._window_instant(v_item -> 'end', v_field || '.end');
            IF v_end <= v_start THEN
                PERFORM respool._fail('RP400', v_field || '.end', format(
                    '%s.end (%s) must be after %s.start (%s)', v_field, respool._iso_utc(v_end), v_field, respool._iso_utc(v_start)));
            END IF;
            v_out := v_out || jsonb_build_array(jsonb_build_object(
                'start', respool._iso_utc(v_start), 'end', respool._iso_utc(v_end)));
        ELSE
            IF jsonb_typeof(v_item -> 'timezone') IS DISTINCT FROM 'string' THEN
                PERFORM respool._fail('RP400', v_field || '.timezone', v_field
                    || '.timezone is required: an IANA time zone name, e.g. Europe/Berlin');
            END IF;
            v_zones := v_zones || (v_item ->> 'timezone');  -- checked below, all at once
            v_zones_at := v_zones_at || v_i;
            v_days := respool._weekdays();  -- absent: every day
            IF v_item ? 'days' THEN
                IF jsonb_typeof(v_item -> 'days') <> 'array' OR jsonb_array_length(v_item -> 'days') = 0 THEN
                    PERFORM respool._fail('RP400', v_field || '.days', v_field
                        || '.days must be a non-empty list of mon, tue, wed, thu, fri, sat, sun (absent: every day)');
                END IF;
                FOR v_day IN SELECT d FROM jsonb_array_elements(v_item -> 'days') d LOOP
                    IF jsonb_typeof(v_day) <> 'string' OR (v_day #>> '{}') <> ALL (respool._weekdays()) THEN
                        PERFORM respool._fail('RP400', v_field || '.days', format(
                            '%s.days: %s is not one of mon, tue, wed, thu, fri, sat, sun', v_field, left(v_day::text, 64)));
                    END IF;
                END LOOP;
                SELECT array_agg(d ORDER BY n) INTO v_days
                  FROM unnest(respool._weekdays()) WITH ORDINALITY w(d, n)
                 WHERE (v_item -> 'days') ? d;
            END IF;
            v_out := v_out || jsonb_build_array(jsonb_build_object(
                'timezone', v_item ->> 'timezone', 'days', to_jsonb(v_days),
                'from', respool._window_hhmm(v_item -> 'from', v_field || '.from'),
                'to', respool._window_hhmm(v_item -> 'to', v_field || '.to')));
        END IF;
        v_i := v_i + 1;
    END LOOP;
    -- One read of pg_timezone_names (it reads the time zone files: tens of milliseconds).
    -- The zone directory also holds files that are not IANA zones: localtime (the machine's
    -- own zone), posixrules, and the posix/ and right/ copies of the whole tree.
    SELECT z.at, z.name INTO v_bad
      FROM unnest(v_zones, v_zones_at) z(name, at)
      LEFT JOIN pg_timezone_names t ON t.name = z.name
     WHERE t.name IS NULL OR z.name IN ('localtime', 'posixrules') OR z.name ~ '^(posix|right)/'
     ORDER BY z.at LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', format('windows[%s].timezone', v_bad.at), format(
            'windows[%s].timezone: unknown time zone %s (an IANA name, e.g. Europe/Berlin)', v_bad.at, left(v_bad.name, 64)));
    END IF;
    RETURN v_out;
END $$;
COMMENT ON FUNCTION respool._windows(jsonb) IS 'Validates and normalizes a policy''s windows (docs/preemption.md, "Time windows"): SQL or JSON null gives NULL (always active); else a non-empty list of at most respool._max_windows() windows, each weekly {timezone (an IANA name PostgreSQL knows: not localtime, posixrules, posix/..., right/...), days (subset of mon..sun, default all, stored in week order), from, to (HH:MM)} or one time {start, end (timestamps with an offset, end after start; stored in UTC)}. RP400 naming the field, e.g. windows[2].timezone.';

CREATE OR REPLACE FUNCTION respool._gap_end(p_local timestamp, p_tz text)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- PostgreSQL reads a local time in the gap with the offset in force before it: an instant
    -- v_hi at or after the gap's end, whose local time is p_local plus the gap's length.
    v_hi bigint := extract(epoch FROM p_local AT TIME ZONE p_tz)::bigint;
    v_lo bigint := v_hi - extract(epoch FROM ((p_local AT TIME ZONE p_tz) AT TIME ZONE p_tz) - p_local)::bigint;
    v_mid bigint;
BEGIN
    -- The gap's end is the first instant whose local time is >= p_local: it lies in (v_lo, v_hi]
    -- (local(v_lo) = p_local minus the gap < p_local <= local(v_hi)), and local
    -- time only moves forward there. Transitions fall on whole seconds: bisect over seconds.
    WHILE v_hi - v_lo > 1 LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        IF (to_timestamp(v_mid) AT TIME ZONE p_tz) >= p_local THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(v_hi);
END $$;
COMMENT ON FUNCTION respool._gap_end(timestamp, text) IS 'For a local time p_local that does not exist in zone p_tz (skipped when the clocks go forward): the first instant after the gap, i.e. the instant the clocks jumped. Only called for such times (respool._local_instant).';

CREATE OR REPLACE FUNCTION respool._local_instant(p_local timestamp, p_tz text)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (p_local AT TIME ZONE p_tz) AT TIME ZONE p_tz = p_local THEN p_local AT TIME ZONE p_tz
                ELSE respool._gap_end(p_local, p_tz) END
$$;
COMMENT ON FUNCTION respool._local_instant(timestamp, text) IS 'The instant a weekly window''s local time p_local means in zone p_tz: the instant itself when it exists; one that exists twice (the clocks go back) is the later one (standard time, PostgreSQL''s rule); one that does not exist (the clocks go forward) is the first instant after the gap, so a window starting or ending in the gap keeps the part of it that exists (docs/preemption.md, "Daylight saving time").';

CREATE OR REPLACE FUNCTION respool._window_spans(p_windows jsonb, p_from timestamptz, p_to timestamptz)
RETURNS TABLE (starts_at timestamptz, ends_at timestamptz) LANGUAGE sql STABLE AS $$
    WITH item AS (
        SELECT w AS item FROM jsonb_array_elements(p_windows) w
    ), raw AS (
        -- Weekly windows: one per local date of their time zone (the date it starts on), from the
        -- day before p_from (a window crossing midnight) to the date of p_to. A local time is
        -- made an instant by respool._local_instant (docs/preemption.md, "Daylight saving time").
        SELECT respool._local_instant(d::date + (item ->> 'from')::time, item ->> 'timezone') AS s,
               respool._local_instant(d::date + CASE WHEN (item ->> 'to')::time <= (item ->> 'from')::time THEN 1 ELSE 0 END
                                              + (item ->> 'to')::time, item ->> 'timezone') AS e
          FROM item,
               generate_series(((p_from AT TIME ZONE (item ->> 'timezone'))::date - 1)::timestamp,
                               (p_to AT TIME ZONE (item ->> 'timezone'))::date::timestamp,
                               interval '1 day') d
         WHERE item ? 'timezone'
           AND (item -> 'days') ? (respool._weekdays())[extract(isodow FROM d)::integer]
        UNION ALL
        SELECT (item ->> 'start')::timestamptz, (item ->> 'end')::timestamptz FROM item WHERE item ? 'start'
        UNION ALL
        SELECT p_from, p_to WHERE p_windows IS NULL  -- no windows: always active
    ), clipped AS (
        SELECT greatest(s, p_from) AS s, least(e, p_to) AS e FROM raw WHERE least(e, p_to) > greatest(s, p_from)
    ), marked AS (
        -- a span opens a new group unless an earlier one reaches it (overlapping or touching)
        SELECT s, e, CASE WHEN s <= max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                          THEN 0 ELSE 1 END AS opens
          FROM clipped
    ), grouped AS (
        SELECT s, e, sum(opens) OVER (ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS g FROM marked
    )
    SELECT min(s), max(e) FROM grouped GROUP BY g ORDER BY 1
$$;
COMMENT ON FUNCTION respool._window_spans(jsonb, timestamptz, timestamptz) IS 'The instants a policy with these (normalized) windows is active inside [p_from, p_to), as merged spans [starts_at, ends_at) in time order: overlapping or touching windows make one span. NULL windows: the whole range. Weekly windows expand per local date of their time zone, so they follow daylight saving time; a window crossing midnight belongs to the day it starts.';

CREATE OR REPLACE FUNCTION respool._window_state(p_windows jsonb, p_now timestamptz,
                                                 OUT active boolean, OUT next_change timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_weekly boolean;
    v_to timestamptz;
    v_span record;
BEGIN
    IF p_windows IS NULL THEN
        active := true;
        next_change := NULL;
        RETURN;
    END IF;
    v_weekly := EXISTS (SELECT FROM jsonb_array_elements(p_windows) w WHERE w ? 'timezone');
    -- A weekly window opens or closes within any 8 days (7 plus a day of DST and crossing midnight);
    -- without weekly windows, the last one-time end is the last change there can be.
    v_to := CASE WHEN v_weekly THEN p_now + interval '8 days'
                 ELSE greatest(p_now, (SELECT max((w ->> 'end')::timestamptz) FROM jsonb_array_elements(p_windows) w)) END;
    SELECT * INTO v_span FROM respool._window_spans(p_windows, p_now, v_to) LIMIT 1;
    IF NOT FOUND THEN
        active := false;
        next_change := NULL;  -- only past one-time windows (weekly ones always come round again)
    ELSIF v_span.starts_at = p_now THEN
        active := true;
        -- weekly windows covering 8 days without a break cover every instant of every week
        next_change := CASE WHEN v_weekly AND v_span.ends_at >= v_to THEN NULL ELSE v_span.ends_at END;
    ELSE
        active := false;
        next_change := v_span.starts_at;
    END IF;
END $$;
COMMENT ON FUNCTION respool._window_state(jsonb, timestamptz) IS 'Whether a policy with these (normalized) windows is active at p_now, and the next instant after p_now that flips it (NULL: never again: no windows, only past one-time windows, or weekly windows covering the whole week).';

CREATE OR REPLACE FUNCTION respool._apply_windows(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    p record;
    s record;
    flipped integer := 0;
BEGIN
    FOR p IN SELECT id, windows, active FROM respool.policies
              WHERE pool_id = p_pool_id AND next_change <= p_now
              ORDER BY id FOR UPDATE LOOP
        s := respool._window_state(p.windows, p_now);
        UPDATE respool.policies SET active = s.active, next_change = s.next_change WHERE id = p.id;
        UPDATE respool.policy_resources
           SET reserved = CASE WHEN s.active THEN configured ELSE 0 END
         WHERE policy_id = p.id AND reserved IS DISTINCT FROM CASE WHEN s.active THEN configured ELSE 0 END;
        IF s.active IS DISTINCT FROM p.active THEN
            flipped := flipped + 1;
        END IF;
    END LOOP;
    RETURN flipped;
END $$;
COMMENT ON FUNCTION respool._apply_windows(uuid, timestamptz) IS 'Applies the window boundaries that passed by p_now in one pool (the caller holds the pool lock: the reconciler''s pass): each policy whose next_change <= p_now gets active and next_change again, and its share in force (policy_resources.reserved) becomes configured while active, 0 outside. Returns how many policies flipped. A second call at the same instant finds next_change moved and does nothing.';

CREATE OR REPLACE FUNCTION respool._check_reserved_fits(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    v record;
BEGIN
    -- The sweep is bounded to one year past p_now and past each one-time boundary still to come
    -- (weekly windows repeat yearly; the proof is below), so a far end costs one year, never a
    -- sweep to it.
    IF NOT EXISTS (SELECT FROM respool.policies p
                    WHERE p.pool_id = p_pool_id AND p.windows IS NOT NULL
                      AND EXISTS (SELECT FROM respool.policy_resources pr WHERE pr.policy_id = p.id AND pr.configured > 0)) THEN
        -- Every share is in force at every instant: one sum per key.
        SELECT pr.key, sum(pr.configured) AS total, coalesce(c.capacity, 0) AS capacity,
               string_agg(format('%s reserves %s', p.subject, pr.configured), ', ' ORDER BY p.subject) AS who
          INTO v
          FROM respool.policy_resources pr
          JOIN respool.policies p ON p.id = pr.policy_id
          LEFT JOIN respool.pool_resources c ON c.pool_id = p.pool_id AND c.key = pr.key
         WHERE p.pool_id = p_pool_id AND pr.configured > 0
         GROUP BY pr.key, c.capacity
        HAVING sum(pr.configured) > coalesce(c.capacity, 0)
         ORDER BY pr.key
         LIMIT 1;
        IF FOUND THEN
            PERFORM respool._fail('RP409', 'capacity', format(
                '%s: reserved shares add up to %s but the pool capacity would be %s (%s)',
                v.key, v.total, v.capacity, v.who));
        END IF;
        RETURN;
    END IF;
    -- A sweep over the instants a share starts or stops being in force, over a bounded set of
    -- ranges. The boundaries b0 = p_now < b1 < ... < bk are p_now and every start and end of a
    -- one-time window still to come; the ranges are [bi, min(bi+1, bi + 1 year)) for each i < k,
    -- and [bk, bk + 1 year).
    --
    -- Why that is every instant there is to check: which shares are in force at an instant t
    -- depends on (a) which one-time windows contain t and (b) where t falls in the week of each
    -- weekly window's time zone, given that zone's UTC offset at t. (a) is the same all through
    -- [bi, bi+1) and, from bk on, no one-time window is open any more. (b) repeats: a weekly
    -- window is a function of the local weekday and time only, and the offsets follow yearly
    -- rules whose periods (summer time, winter time) each last far longer than a week, with the
    -- clocks changing on a rule-given weekday; so one year of weekly windows shows every
    -- combination of offsets, each with every position in the week, and every change-of-clock
    -- night, that any later year shows (this is what the one-year horizon has always rested on).
    -- Hence the first year of each stretch [bi, bi+1), and one year from bk, meet every sum of
    -- shares in force that the rest of that stretch, and all time after bk, can meet. The sweep
    -- is thus at most k + 1 years of weekly windows, whatever the ends (a window ending in 9999
    -- costs one more year, not eight millennia); k is bounded by the pool's policies times
    -- respool._max_windows(). Gaps between ranges are harmless: every span is cut at its range's
    -- end, so its share is added and taken away within the range.
    WITH pol AS (
        SELECT p.id, p.subject, p.windows FROM respool.policies p
         WHERE p.pool_id = p_pool_id
           AND EXISTS (SELECT FROM respool.policy_resources pr WHERE pr.policy_id = p.id AND pr.configured > 0)
    ), bounds AS (
        SELECT p_now AS at
        UNION
        SELECT b.at
          FROM pol, jsonb_array_elements(pol.windows) w,
               LATERAL (VALUES ((w ->> 'start')::timestamptz), ((w ->> 'end')::timestamptz)) b(at)
         WHERE w ? 'start' AND b.at > p_now
    ), ranges AS (
        -- least() ignores the NULL lead of the last boundary
        SELECT at AS r_from, least(lead(at) OVER (ORDER BY at), at + interval '1 year') AS r_to FROM bounds
    ), pieces AS (
        SELECT pol.id, s.starts_at, s.ends_at
          FROM pol, ranges, respool._window_spans(pol.windows, ranges.r_from, ranges.r_to) s
    ), marked AS (  -- the ranges may overlap: merge each policy's pieces again
        SELECT id, starts_at, ends_at,
               CASE WHEN starts_at <= max(ends_at) OVER (PARTITION BY id ORDER BY starts_at, ends_at
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                    THEN 0 ELSE 1 END AS opens
          FROM pieces
    ), spans AS (
        SELECT id, min(starts_at) AS starts_at, max(ends_at) AS ends_at
          FROM (SELECT *, sum(opens) OVER (PARTITION BY id ORDER BY starts_at, ends_at ROWS UNBOUNDED PRECEDING) AS g
                  FROM marked) x
         GROUP BY id, g
    ), deltas AS (
        SELECT pr.key, t.at, sum(t.sign * pr.configured) AS delta
          FROM spans
          JOIN respool.policy_resources pr ON pr.policy_id = spans.id AND pr.configured > 0
          CROSS JOIN LATERAL (VALUES (spans.starts_at, 1), (spans.ends_at, -1)) t(at, sign)
         GROUP BY pr.key, t.at
    ), totals AS (
        SELECT key, at, sum(delta) OVER (PARTITION BY key ORDER BY at) AS total FROM deltas
    )
    SELECT t.key, t.at, t.total, coalesce(c.capacity, 0) AS capacity INTO v
      FROM totals t
      LEFT JOIN respool.pool_resources c ON c.pool_id = p_pool_id AND c.key = t.key
     WHERE t.total > coalesce(c.capacity, 0)
     ORDER BY t.at, t.key
     LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP409', 'capacity', format(
            '%s: reserved shares add up to %s at %s but the pool capacity would be %s (%s)',
            v.key, v.total, respool._iso_utc(v.at), v.capacity,
            (SELECT string_agg(format('%s reserves %s', p.subject, pr.configured), ', ' ORDER BY p.subject)
               FROM respool.policies p
               JOIN respool.policy_resources pr ON pr.policy_id = p.id AND pr.key = v.key AND pr.configured > 0
              WHERE p.pool_id = p_pool_id
                AND EXISTS (SELECT FROM respool._window_spans(p.windows, v.at, v.at + interval '1 microsecond')))));
    END IF;
END $$;
COMMENT ON FUNCTION respool._check_reserved_fits(uuid, timestamptz) IS 'RP409 when, for any key, the reserved shares (configured) of the pool''s policies in force at one instant from p_now on exceed its capacity: policies without windows count at every instant, windowed ones when in force (docs/preemption.md, "Time windows"). The message names the key, the total, the first such instant (ISO UTC, only when a policy has windows), the capacity and the policies in force then. Read-only.';
