-- Jobs and node agents (docs/jobs.md): a job is a request that carries a command; the agent of
-- the node it is placed on claims each attempt once, runs it, sends its logs and releases it.
-- Everything that holds for a request holds for a job; this file adds only what a job needs.

CREATE OR REPLACE FUNCTION respool._job_check(p_job jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_count bigint;
    v_bad text;
BEGIN
    IF respool._absent_object(p_job, 'job', 'job must be an object with command, env, workdir, name') THEN
        RETURN;
    END IF;
    SELECT min(k) INTO v_bad FROM jsonb_object_keys(p_job) k
     WHERE k NOT IN ('command', 'env', 'workdir', 'name', 'array_index');
    IF v_bad IS NOT NULL THEN
        PERFORM respool._fail('RP400', 'job.' || left(v_bad, 70), format('unknown field %L', left(v_bad, 70)));
    END IF;
    IF jsonb_typeof(p_job -> 'command') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_job -> 'command') NOT BETWEEN 1 AND 256
       OR EXISTS (SELECT FROM jsonb_array_elements(p_job -> 'command') a
                   WHERE jsonb_typeof(a) <> 'string' OR a #>> '{}' = '' OR length(a #>> '{}') > 65536) THEN
        PERFORM respool._fail('RP400', 'job.command',
                              'job.command must be a list of 1 to 256 non-empty strings (the argv)');
    END IF;
    IF jsonb_typeof(p_job -> 'env') NOT IN ('object', 'null') THEN
        PERFORM respool._fail('RP400', 'job.env', 'job.env must be an object of NAME: string');
    END IF;
    IF jsonb_typeof(p_job -> 'env') = 'object' THEN
        SELECT count(*), min(x.key) FILTER (WHERE x.key !~ '^[A-Za-z_][A-Za-z0-9_]{0,127}$'
                                                  OR jsonb_typeof(x.value) <> 'string'
                                                  OR length(x.value #>> '{}') > 65536)
          INTO v_count, v_bad FROM jsonb_each(p_job -> 'env') x;
        IF v_count > 128 THEN
            PERFORM respool._fail('RP400', 'job.env', 'job.env has more than 128 entries');
        END IF;
        IF v_bad IS NOT NULL THEN
            PERFORM respool._fail('RP400', 'job.env.' || left(v_bad, 70),
                'job.env names match ^[A-Za-z_][A-Za-z0-9_]{0,127}$ and map to strings');
        END IF;
    END IF;
    IF jsonb_typeof(p_job -> 'workdir') NOT IN ('string', 'null')
       OR length(p_job ->> 'workdir') NOT BETWEEN 1 AND 4096 THEN
        PERFORM respool._fail('RP400', 'job.workdir', 'job.workdir must be a path of 1 to 4096 characters, or null');
    END IF;
    IF jsonb_typeof(p_job -> 'name') NOT IN ('string', 'null')
       OR length(p_job ->> 'name') NOT BETWEEN 1 AND 128 THEN
        PERFORM respool._fail('RP400', 'job.name', 'job.name must have 1 to 128 characters, or null');
    END IF;
    IF jsonb_typeof(p_job -> 'array_index') NOT IN ('number', 'null') THEN
        PERFORM respool._fail('RP400', 'job.array_index', 'job.array_index is set by a batch with array true');
    END IF;
END $$;
COMMENT ON FUNCTION respool._job_check(jsonb) IS
    'Checks the job of a create body (absent or null: not a job): command a list of 1 to 256 non-empty strings, env at most 128 NAME: string entries, workdir and name strings or null; RP400 naming job.<field> (job.env.NAME). array_index is set by the server for array batches. Never puts an env value in an error.';

CREATE OR REPLACE FUNCTION respool._job_store(p_id uuid, p_job jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_job IS NULL OR p_job = 'null'::jsonb THEN
        RETURN;
    END IF;
    UPDATE respool.requests
       SET command = p_job -> 'command',
           job_env = coalesce(nullif(p_job -> 'env', 'null'), '{}'),
           workdir = p_job ->> 'workdir',
           job_name = p_job ->> 'name',
           array_index = (p_job ->> 'array_index')::integer
     WHERE id = p_id;
END $$;
COMMENT ON FUNCTION respool._job_store(uuid, jsonb) IS
    'Stores a checked job (respool._job_check) on the request a create has just inserted, before it is granted, so the node choice already knows it is a job. Nothing for a request without a job.';

CREATE OR REPLACE FUNCTION respool._job_env_doc(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(job_env, '{}') FROM respool.requests WHERE id = p_id
$$;
COMMENT ON FUNCTION respool._job_env_doc(uuid) IS
    'A job''s environment values: only for the claim answer to the agent that claimed it.';

CREATE OR REPLACE FUNCTION respool.agent_may_see(p_id uuid, p_node_id uuid, p_pool_id uuid)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT FROM respool.requests r
         WHERE r.id = p_id AND r.command IS NOT NULL
           AND CASE WHEN p_node_id IS NOT NULL THEN
                        r.claimed_node_id = p_node_id
                        OR EXISTS (SELECT FROM respool.placements pl WHERE pl.request_id = r.id AND pl.node_id = p_node_id)
                        OR (r.last_placement ->> 'node') = (SELECT n.name FROM respool.nodes n WHERE n.id = p_node_id)
                        OR EXISTS (SELECT FROM respool.job_log_attempts a WHERE a.request_id = r.id AND a.node_id = p_node_id)
                    ELSE r.pool_id = p_pool_id END)
$$;
COMMENT ON FUNCTION respool.agent_may_see(uuid, uuid, uuid) IS
    'Whether an agent bound to node p_node_id (or, with p_node_id NULL, to pool p_pool_id) may see request p_id: a job placed on its node now, claimed by it (any attempt), or last placed there (a pool agent: a job of its pool). Everything else is invisible to it (404).';

CREATE OR REPLACE FUNCTION respool.agent_jobs(p_node_id uuid, p_pool_id uuid, p_claimed boolean DEFAULT false)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(respool.request_json(r.id) ORDER BY r.allocated_at, r.id), '[]')
      FROM respool.requests r
     WHERE r.command IS NOT NULL
       AND CASE WHEN p_node_id IS NOT NULL
                THEN EXISTS (SELECT FROM respool.placements pl WHERE pl.request_id = r.id AND pl.node_id = p_node_id)
                ELSE r.pool_id = p_pool_id AND NOT EXISTS (SELECT FROM respool.placements pl WHERE pl.request_id = r.id) END
       AND CASE WHEN p_claimed
                THEN r.status IN ('allocated', 'preempting') AND r.claimed_attempt = r.attempt
                     AND r.claimed_node_id IS NOT DISTINCT FROM p_node_id
                ELSE r.status = 'allocated' AND r.claimed_attempt IS DISTINCT FROM r.attempt END
$$;
COMMENT ON FUNCTION respool.agent_jobs(uuid, uuid, boolean) IS
    'The jobs an agent (bound to node p_node_id, or to pool p_pool_id without nodes) has to run: allocated jobs placed on its node whose current attempt no agent has claimed, oldest grant first; p_claimed: the jobs it has claimed on their current attempt that still hold units. Request documents (env values never). Read-only.';

CREATE OR REPLACE FUNCTION respool.claim_job(p_id uuid, p_attempt integer, p_node_id uuid, p_pool_id uuid,
                                             p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_doc jsonb;
BEGIN
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM respool._fail('RP400', 'attempt', 'attempt must be an integer >= 1');
    END IF;
    IF NOT respool.agent_may_see(p_id, p_node_id, p_pool_id) THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    -- The request's row lock only: a claim changes no units, so it does not queue behind the
    -- pool's grants and releases (nor they behind it); the attempt is fenced under this lock.
    SELECT * INTO r FROM respool.requests WHERE id = p_id FOR UPDATE;
    IF p_attempt <> r.attempt THEN
        PERFORM respool._fail('RP409', 'attempt',
                              format('stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
    END IF;
    IF r.status <> 'allocated' THEN
        PERFORM respool._fail('RP409', 'status', format('request %s is %s, not allocated: nothing to run', p_id, r.status));
    END IF;
    IF p_node_id IS NOT NULL AND NOT EXISTS (SELECT FROM respool.placements WHERE request_id = p_id AND node_id = p_node_id) THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    IF r.claimed_attempt = r.attempt THEN
        PERFORM respool._fail('RP409', 'attempt', format('attempt %s of request %s is already claimed', r.attempt, p_id));
    END IF;
    -- The lease runs from the claim: until then the job waits for its agent, not for a heartbeat
    -- (an unclaimed job on a lost node goes back to the queue, respool._agent_pass).
    UPDATE respool.requests
       SET claimed_node_id = p_node_id, claimed_attempt = r.attempt, claimed_at = p_now, exit_code = NULL,
           lease_expires_at = CASE WHEN gang_id IS NULL THEN p_now + make_interval(secs => lease_seconds)
                                   ELSE lease_expires_at END,
           updated_at = p_now
     WHERE id = p_id AND attempt = r.attempt AND status = 'allocated';
    -- who ran this attempt: its agent is told "stale" (409), not "not found", once the job moved
    INSERT INTO respool.job_log_attempts (request_id, attempt, node_id) VALUES (p_id, r.attempt, p_node_id)
        ON CONFLICT (request_id, attempt) DO UPDATE SET node_id = EXCLUDED.node_id;
    v_doc := respool.request_json(p_id);
    RETURN jsonb_set(v_doc, '{job,env}', respool._job_env_doc(p_id));
END $$;
COMMENT ON FUNCTION respool.claim_job(uuid, integer, uuid, uuid, timestamptz) IS
    'An agent claims attempt p_attempt of a job placed on its node (pool agent: in its pool): exactly once per attempt, fenced under the request''s lock (RP409 for a stale attempt, one already claimed, or a job no longer allocated; RP404 for a job it cannot see). Starts the lease (a gang member''s runs from its grant) and clears the previous run''s exit_code. Only the request row is locked. Returns the request document plus job.env, the values: the only answer that carries them.';

CREATE OR REPLACE FUNCTION respool.release_job(p_id uuid, p_attempt integer, p_exit_code integer, p_reason text,
                                               p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_reason text;
BEGIN
    IF p_reason IS NOT NULL THEN
        v_reason := 'agent_restarted';  -- the one reason an agent reports
        IF p_reason <> v_reason THEN
            PERFORM respool._fail('RP400', 'reason', 'reason must be agent_restarted or null');
        END IF;
    END IF;
    r := respool._lock_request(p_id, p_attempt);
    IF p_exit_code IS NOT NULL AND r.status IN ('allocated', 'preempting') THEN
        UPDATE respool.requests SET exit_code = p_exit_code WHERE id = p_id;
    END IF;
    PERFORM respool._end_locked(p_id, 'released', v_reason,
                                CASE WHEN v_reason IS NOT NULL
                                     THEN 'released by a restarted agent: the job''s processes were gone'
                                     WHEN p_exit_code IS NOT NULL THEN format('exited with code %s', p_exit_code)
                                     ELSE '' END,
                                'released_while_queued', 'released before it was allocated', p_now);
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool.release_job(uuid, integer, integer, text, timestamptz) IS
    'Release with what the run reported: as respool.release_request (attempt-fenced, allocated -> released, preempting -> preempted and requeued per max_retries, queued -> cancelled), recording p_exit_code on the request while it still holds units and p_reason (agent_restarted or NULL) on the status change.';

CREATE OR REPLACE FUNCTION respool.agent_heartbeat(p_node_id uuid, p_pool_id uuid, p_interval integer,
                                                   p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_node respool.nodes;
    v_was text;
BEGIN
    IF p_interval IS NULL OR p_interval NOT BETWEEN 1 AND 300 THEN
        PERFORM respool._fail('RP400', 'interval_seconds', 'interval_seconds must be between 1 and 300');
    END IF;
    IF p_node_id IS NULL THEN
        RETURN jsonb_build_object('node', NULL, 'pool', (SELECT name FROM respool.pools WHERE id = p_pool_id));
    END IF;
    SELECT agent INTO v_was FROM respool.nodes WHERE id = p_node_id;
    IF NOT FOUND THEN
        PERFORM respool._fail('RP404', 'node', 'the node this agent token is bound to no longer exists');
    END IF;
    UPDATE respool.nodes SET agent = 'ready', agent_seen_at = p_now, agent_interval_seconds = p_interval
     WHERE id = p_node_id RETURNING * INTO v_node;
    IF v_was IS DISTINCT FROM 'ready' AND v_node.pool_id IS NOT NULL THEN
        -- The node takes jobs again: grant what now fits there.
        PERFORM respool._lock_pools(ARRAY[v_node.pool_id]);
        PERFORM respool.allocate_pool(v_node.pool_id, p_now);
    END IF;
    RETURN jsonb_build_object('node', v_node.name, 'pool', (SELECT name FROM respool.pools WHERE id = v_node.pool_id));
END $$;
COMMENT ON FUNCTION respool.agent_heartbeat(uuid, uuid, integer, timestamptz) IS
    'An agent is alive: its node''s agent becomes ready, heard at p_now, with its heartbeat interval (1-300 s; RP400 otherwise); a node that was lost or never had an agent gets what now fits granted. A pool agent (p_node_id NULL) changes nothing. Returns {node, pool}.';

CREATE OR REPLACE FUNCTION respool._agent_pass(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_done integer := 0;
BEGIN
    UPDATE respool.nodes SET agent = 'lost'
     WHERE pool_id = p_pool_id AND agent = 'ready'
       AND agent_seen_at + make_interval(secs => 3 * agent_interval_seconds) <= p_now;
    -- Jobs granted to a lost node and not claimed within 3 of its agent's intervals go back to
    -- the queue with the same attempt (not a retry: they never ran).
    FOR v_id IN SELECT r.id FROM respool.requests r
                  JOIN respool.placements pl ON pl.request_id = r.id
                  JOIN respool.nodes n ON n.id = pl.node_id
                 WHERE r.pool_id = p_pool_id AND r.command IS NOT NULL AND r.status = 'allocated'
                   AND r.gang_id IS NULL AND r.claimed_attempt IS DISTINCT FROM r.attempt
                   AND n.agent = 'lost'
                   AND r.allocated_at + make_interval(secs => 3 * n.agent_interval_seconds) <= p_now
                 ORDER BY r.id FOR UPDATE OF r SKIP LOCKED LOOP
        PERFORM respool._unplace(v_id);
        UPDATE respool.requests
           SET pool_id = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_id END,
               pool_name = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_name END
         WHERE id = v_id;
        IF respool._enqueue(v_id) > 0 THEN
            PERFORM respool._set_status(v_id, 'queued', 'unclaimed',
                                        'its node''s agent is lost and never claimed it: queued again, same attempt', p_now);
        ELSE
            PERFORM respool._reject_unfittable(v_id, p_now);
        END IF;
        v_done := v_done + 1;
    END LOOP;
    RETURN v_done;
END $$;
COMMENT ON FUNCTION respool._agent_pass(uuid, timestamptz) IS
    'The reconciler''s agent step for a pool it has locked: a node whose agent was not heard for 3 of its intervals becomes lost (it takes no new jobs, respool._node_for); a job allocated on a lost node, not claimed on its current attempt and granted at least 3 intervals ago gives its units back and is queued again with the same attempt (reason unclaimed), or rejected when it can no longer fit. Gang members are left to their lease. Returns how many jobs were queued again.';

CREATE OR REPLACE FUNCTION respool._job_requeue_expired(p_id uuid, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests := (SELECT q FROM respool.requests q WHERE q.id = p_id);
BEGIN
    IF r.command IS NULL OR r.gang_id IS NOT NULL OR r.attempt > r.max_retries THEN
        RETURN false;
    END IF;
    UPDATE respool.requests
       SET attempt = attempt + 1,
           pool_id = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_id END,
           pool_name = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_name END
     WHERE id = p_id;
    IF respool._enqueue(p_id) = 0 THEN
        UPDATE respool.requests SET attempt = r.attempt, pool_id = r.pool_id, pool_name = r.pool_name WHERE id = p_id;
        RETURN false;
    END IF;
    PERFORM respool._set_status(p_id, 'queued', 'expired',
                                format('lease lapsed without a heartbeat (its agent is gone?): requeued for attempt %s',
                                       r.attempt + 1), p_now);
    RETURN true;
END $$;
COMMENT ON FUNCTION respool._job_requeue_expired(uuid, timestamptz) IS
    'A job (not a gang member) whose lease lapsed, its units already given back by the caller (respool._expire_one): while attempt <= max_retries it is queued again as attempt + 1 (original queue time, reason expired) and true is returned; otherwise, or when it fits nowhere any more, nothing changes and false is returned (it then ends expired).';

CREATE OR REPLACE FUNCTION respool.append_job_log(p_id uuid, p_attempt integer, p_seq integer, p_stream text,
                                                  p_data text, p_limit bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_half bigint := greatest(p_limit / 2, 1);
    a respool.job_log_attempts;
    v_bytes bigint := octet_length(p_data);
    v_head text;
    v_rest text;
    o respool.job_logs;
    v_excess bigint;
    v_cut text;
    v_current integer;
BEGIN
    IF p_seq IS NULL OR p_seq < 0 THEN
        PERFORM respool._fail('RP400', 'seq', 'seq must be an integer >= 0');
    END IF;
    IF p_stream IS NULL OR p_stream NOT IN ('stdout', 'stderr') THEN
        PERFORM respool._fail('RP400', 'stream', 'stream must be stdout or stderr');
    END IF;
    v_current := (SELECT attempt FROM respool.requests WHERE id = p_id);
    IF v_current IS NULL THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    ELSIF p_attempt IS NULL OR p_attempt < 1 THEN
        PERFORM respool._fail('RP400', 'attempt', 'attempt must be an integer >= 1');
    ELSIF p_attempt > v_current THEN
        PERFORM respool._fail('RP409', 'attempt', format('request %s has no attempt %s', p_id, p_attempt));
    ELSIF p_attempt < v_current THEN  -- fenced off like its heartbeat and release
        PERFORM respool._fail('RP409', 'attempt',
                              format('stale attempt %s: request %s is on attempt %s', p_attempt, p_id, v_current));
    END IF;
    INSERT INTO respool.job_log_attempts (request_id, attempt) VALUES (p_id, p_attempt) ON CONFLICT DO NOTHING;
    SELECT * INTO a FROM respool.job_log_attempts WHERE request_id = p_id AND attempt = p_attempt FOR UPDATE;
    IF p_seq <= a.last_seq THEN
        RETURN;  -- a retried send of a chunk already stored
    END IF;
    -- The head: the first half of the bound, kept for good.
    IF a.head_bytes < v_half THEN
        v_head := p_data;
        WHILE octet_length(v_head) > v_half - a.head_bytes LOOP
            v_head := left(v_head, length(v_head) - greatest(1, (octet_length(v_head) - (v_half - a.head_bytes))::integer));
        END LOOP;
        v_rest := substr(p_data, length(v_head) + 1);
    ELSE
        v_head := '';
        v_rest := p_data;
    END IF;
    IF v_rest = '' THEN
        INSERT INTO respool.job_logs (request_id, attempt, seq, stream, data, bytes, head)
        VALUES (p_id, p_attempt, p_seq, p_stream, v_head, octet_length(v_head), true);
        a.head_bytes := a.head_bytes + octet_length(v_head);
    ELSE
        -- (a chunk that fills the head keeps its start there and its end in the tail: one row,
        -- counted in the tail, the head part counted in the head)
        INSERT INTO respool.job_logs (request_id, attempt, seq, stream, data, bytes, head)
        VALUES (p_id, p_attempt, p_seq, p_stream, v_rest, octet_length(v_rest), false);
        a.tail_bytes := a.tail_bytes + octet_length(v_rest);
        IF v_head <> '' THEN
            INSERT INTO respool.job_logs (request_id, attempt, seq, stream, data, bytes, head)
            VALUES (p_id, p_attempt, -1 - p_seq, p_stream, v_head, octet_length(v_head), true)
            ON CONFLICT DO NOTHING;
            a.head_bytes := a.head_bytes + octet_length(v_head);
        END IF;
    END IF;
    -- The tail: the last half; the oldest tail bytes go first.
    WHILE a.tail_bytes > v_half LOOP
        SELECT * INTO o FROM respool.job_logs
         WHERE request_id = p_id AND attempt = p_attempt AND NOT head ORDER BY seq LIMIT 1;
        v_excess := a.tail_bytes - v_half;
        IF o.bytes <= v_excess THEN
            DELETE FROM respool.job_logs WHERE request_id = p_id AND attempt = p_attempt AND seq = o.seq;
            a.tail_bytes := a.tail_bytes - o.bytes;
            a.dropped_bytes := a.dropped_bytes + o.bytes;
        ELSE
            v_cut := o.data;
            WHILE octet_length(o.data) - octet_length(v_cut) < v_excess LOOP
                v_cut := substr(v_cut, 1 + greatest(1, (v_excess - (octet_length(o.data) - octet_length(v_cut)))::integer));
            END LOOP;
            UPDATE respool.job_logs SET data = v_cut, bytes = octet_length(v_cut)
             WHERE request_id = p_id AND attempt = p_attempt AND seq = o.seq;
            a.tail_bytes := a.tail_bytes - (o.bytes - octet_length(v_cut));
            a.dropped_bytes := a.dropped_bytes + (o.bytes - octet_length(v_cut));
        END IF;
    END LOOP;
    UPDATE respool.job_log_attempts
       SET head_bytes = a.head_bytes, tail_bytes = a.tail_bytes, dropped_bytes = a.dropped_bytes, last_seq = p_seq
     WHERE request_id = p_id AND attempt = p_attempt;
    PERFORM pg_notify('respool_request', json_build_object('id', p_id)::text);  -- wakes log followers
END $$;
COMMENT ON FUNCTION respool.append_job_log(uuid, integer, integer, text, text, bigint) IS
    'Stores one output chunk of attempt p_attempt of a job (seq from 0; a seq at or below the last stored is a retried send and is ignored), keeping at most p_limit bytes per attempt: the first half (the head) for good, and the last half (the tail), dropping the oldest tail bytes and counting them. Appends of one attempt are serialised on its job_log_attempts row. Wakes log followers (NOTIFY, at commit). RP400 bad seq, stream or attempt, RP404 unknown job, RP409 an attempt that is not the current one (stale, or not reached).';

CREATE OR REPLACE FUNCTION respool.job_logs(p_id uuid, p_attempt integer, p_after integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    r respool.requests := (SELECT q FROM respool.requests q WHERE q.id = p_id);
    v_attempt integer;
    a respool.job_log_attempts;
    v_chunks jsonb;
    v_first_tail integer;
    v_marker text;
BEGIN
    IF r.id IS NULL THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    v_attempt := coalesce(p_attempt, r.attempt);
    SELECT * INTO a FROM respool.job_log_attempts WHERE request_id = p_id AND attempt = v_attempt;
    SELECT min(seq) INTO v_first_tail FROM respool.job_logs
     WHERE request_id = p_id AND attempt = v_attempt AND NOT head;
    IF coalesce(a.dropped_bytes, 0) > 0 THEN
        -- A line of its own: after a newline when the head does not end with one.
        v_marker := CASE WHEN (SELECT right(l.data, 1) FROM respool.job_logs l
                                WHERE l.request_id = p_id AND l.attempt = v_attempt AND l.head
                                ORDER BY CASE WHEN l.seq < 0 THEN -1 - l.seq ELSE l.seq END DESC LIMIT 1)
                                IS DISTINCT FROM E'\n' THEN E'\n' ELSE '' END
                    || format(E'[... %s bytes dropped ...]\n', a.dropped_bytes);
    END IF;
    -- Chunks in seq order (a head part stored as -1 - seq sorts with its seq); the marker goes
    -- in front of the first tail chunk once bytes were dropped.
    SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'seq', c.s, 'stream', c.stream,
                        'data', CASE WHEN NOT c.head AND c.seq = v_first_tail AND v_marker IS NOT NULL
                                     THEN v_marker || c.data ELSE c.data END)
                    ORDER BY c.s, c.head DESC), '[]')
      INTO v_chunks
      FROM (SELECT l.*, CASE WHEN l.seq < 0 THEN -1 - l.seq ELSE l.seq END AS s
              FROM respool.job_logs l WHERE l.request_id = p_id AND l.attempt = v_attempt) c
     WHERE c.s > coalesce(p_after, -1);
    RETURN jsonb_build_object(
        'attempt', v_attempt, 'chunks', v_chunks,
        'next', greatest(coalesce(p_after, -1), coalesce(a.last_seq, -1)),
        'truncated', coalesce(a.dropped_bytes, 0) > 0,
        'done', v_attempt < r.attempt OR respool._is_terminal(r.status)
                OR (r.status = 'queued' AND v_attempt = r.attempt AND r.claimed_attempt = v_attempt));
END $$;
COMMENT ON FUNCTION respool.job_logs(uuid, integer, integer) IS
    'The stored output of one attempt of a job (default: the current one) after seq p_after: {attempt, chunks [{seq, stream, data}] in seq order, next (the last seq stored), truncated (bytes were dropped between head and tail; the marker line [... N bytes dropped ...] opens the first tail chunk), done (the attempt has ended)}. RP404 for an unknown request. Read-only.';

CREATE OR REPLACE FUNCTION respool._job_granted_notify()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- An agent long-polls under its node's id (a pool agent: its pool's id); a grant wakes the
    -- agent that is to run it (after commit). In a pool with nodes the grant's placement row
    -- names the node: the placements trigger sends that one.
    IF TG_TABLE_NAME = 'placements' THEN
        IF EXISTS (SELECT FROM respool.requests r WHERE r.id = NEW.request_id AND r.command IS NOT NULL) THEN
            PERFORM pg_notify('respool_request', json_build_object('id', NEW.node_id)::text);
        END IF;
    ELSIF NOT respool._pool_has_nodes(NEW.pool_id) THEN
        PERFORM pg_notify('respool_request', json_build_object('id', NEW.pool_id)::text);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION respool._job_granted_notify() IS
    'Trigger: a job granted wakes the agent that is to run it, at commit: a NOTIFY keyed by the id of the node it is placed on (placements insert), or of its pool when the pool has no nodes (requests update). A hint: the agent reads its list again, and re-reads every few seconds anyway.';
CREATE OR REPLACE TRIGGER requests_job_granted AFTER UPDATE OF status ON respool.requests
    FOR EACH ROW WHEN (NEW.command IS NOT NULL AND NEW.status = 'allocated' AND OLD.status IS DISTINCT FROM 'allocated')
    EXECUTE FUNCTION respool._job_granted_notify();
CREATE OR REPLACE TRIGGER placements_job_placed AFTER INSERT ON respool.placements
    FOR EACH ROW EXECUTE FUNCTION respool._job_granted_notify();
