-- The bounds and patterns of input values: one definition each, used by every check in SQL.
-- Their twins for the HTTP layer are the constants of client/respool_client/wire.py;
-- tests/client/test_wire_agrees_with_sql.py proves both agree (docs/api.md, "Numbers and bounds").
-- LANGUAGE sql IMMUTABLE: the planner inlines them, so a check costs what its literal did.

CREATE OR REPLACE FUNCTION respool._max_amount()
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000000000000000::bigint $$;
COMMENT ON FUNCTION respool._max_amount() IS 'The largest amount, capacity, reservation or limit of one key (10^15): exact in every JSON client (below 2^53), and 9,223 of them sum within bigint, so usage and demand sums cannot overflow.';

CREATE OR REPLACE FUNCTION respool._max_total()
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 4611686018427387904::bigint $$;
COMMENT ON FUNCTION respool._max_total() IS 'The ceiling of a usage counter that no capacity or limit bounds (an untracked soft key of a pool, a key a policy does not limit): 2^62, so that counter + one amount (<= _max_amount()) never overflows bigint.';

CREATE OR REPLACE FUNCTION respool._max_keys()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 64 $$;
COMMENT ON FUNCTION respool._max_keys() IS 'The most keys of one resource map or label map.';

CREATE OR REPLACE FUNCTION respool._key_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[a-z][a-z0-9_]{0,62}$' $$;
COMMENT ON FUNCTION respool._key_pattern() IS 'The regular expression of a resource key.';

CREATE OR REPLACE FUNCTION respool._pool_name_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[a-z0-9][a-z0-9._-]{0,62}$' $$;
COMMENT ON FUNCTION respool._pool_name_pattern() IS 'The regular expression of a pool name.';

CREATE OR REPLACE FUNCTION respool._subject_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$' $$;
COMMENT ON FUNCTION respool._subject_pattern() IS 'The regular expression of a subject (and of a token name).';

CREATE OR REPLACE FUNCTION respool._memory_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i?B?)\s*$'
$$;
COMMENT ON FUNCTION respool._memory_pattern() IS 'The regular expression of settings.memory: group 1 the number, group 2 the unit (K M G T P, powers of 1000, with an optional B; Ki Mi Gi Ti Pi, powers of 1024, with an optional B).';

CREATE OR REPLACE FUNCTION respool._max_seconds()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 31536000 $$;
COMMENT ON FUNCTION respool._max_seconds() IS 'The longest lease, run cap or starvation guard, in seconds (one year).';

CREATE OR REPLACE FUNCTION respool._max_grace_seconds()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 86400 $$;
COMMENT ON FUNCTION respool._max_grace_seconds() IS 'The longest preemption grace, in seconds (one day).';

CREATE OR REPLACE FUNCTION respool._max_retries()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION respool._max_retries() IS 'The largest max_retries of a request.';

CREATE OR REPLACE FUNCTION respool._max_batch()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION respool._max_batch() IS 'The most members of one batch create, and the largest page of a request list.';

CREATE OR REPLACE FUNCTION respool._max_key_length()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 200 $$;
COMMENT ON FUNCTION respool._max_key_length() IS 'The longest idempotency_key, in characters (the table''s CHECK says the same).';

CREATE OR REPLACE FUNCTION respool._max_description()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 2000 $$;
COMMENT ON FUNCTION respool._max_description() IS 'The longest description of a pool or policy, in characters.';

CREATE OR REPLACE FUNCTION respool._int32_max()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 2147483647 $$;
COMMENT ON FUNCTION respool._int32_max() IS 'The largest integer column value (priority, attempt): 2^31-1; the smallest is -2^31.';

CREATE OR REPLACE FUNCTION respool._label_key_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[a-z0-9][a-z0-9._/-]{0,62}$' $$;
COMMENT ON FUNCTION respool._label_key_pattern() IS 'A node label''s name (docs/placement.md), e.g. gpu-type.';

CREATE OR REPLACE FUNCTION respool._label_value_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[^\x01-\x1f\x7f]{0,63}$' $$;
COMMENT ON FUNCTION respool._label_value_pattern() IS 'A node label''s value: at most 63 printable characters (no control characters).';

CREATE OR REPLACE FUNCTION respool._max_device_id()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 128 $$;
COMMENT ON FUNCTION respool._max_device_id() IS 'The longest device id, in characters (a GPU UUID or a MIG id fits).';

CREATE OR REPLACE FUNCTION respool._policy_subject_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[A-Za-z0-9*][A-Za-z0-9_.:/@*-]{0,127}$' $$;
COMMENT ON FUNCTION respool._policy_subject_pattern() IS 'The regular expression of a policy''s subject: a subject, or a pattern with * covering a team''s subjects (docs/preemption.md, "Team quotas").';

CREATE OR REPLACE FUNCTION respool._group_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^[^\x01-\x1f\x7f]{1,128}$' $$;
COMMENT ON FUNCTION respool._group_pattern() IS 'A preemption group: 1 to 128 printable characters (no control characters).';

CREATE OR REPLACE FUNCTION respool._hhmm_pattern()
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '^([01][0-9]|2[0-3]):[0-5][0-9]$' $$;
COMMENT ON FUNCTION respool._hhmm_pattern() IS 'A time of day of a weekly window (from / to): HH:MM, 00:00 to 23:59.';

CREATE OR REPLACE FUNCTION respool._max_windows()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 64 $$;
COMMENT ON FUNCTION respool._max_windows() IS 'The most windows of one policy.';
