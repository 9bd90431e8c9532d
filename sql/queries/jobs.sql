-- Jobs and agents (sql/functions/048_jobs.sql, docs/jobs.md).

-- agent_may_see --
-- Whether the agent bound to node $2 (or pool $3) may see request $1.
SELECT respool.agent_may_see(p_id => $1, p_node_id => $2, p_pool_id => $3);

-- agent_jobs --
-- The agent's jobs: allocated and unclaimed on this attempt, or ($3) the ones it claimed.
SELECT respool.agent_jobs(p_node_id => $1, p_pool_id => $2, p_claimed => $3);

-- agent_heartbeat --
-- The agent of node $1 (or pool $2) is alive; heartbeats every $3 seconds.
SELECT respool.agent_heartbeat(p_node_id => $1, p_pool_id => $2, p_interval => $3);

-- claim_job --
-- Claim attempt $2 of job $1 for the agent of node $3 (or pool $4); the document plus job.env.
SELECT respool.claim_job(p_id => $1, p_attempt => $2, p_node_id => $3, p_pool_id => $4);

-- release_job --
-- Release attempt $2 of job $1 with the run's exit code $3 and reason $4.
SELECT respool.release_job(p_id => $1, p_attempt => $2, p_exit_code => $3, p_reason => $4);

-- append_job_log --
-- Store one output chunk (seq-deduplicated, bounded per attempt by $6 bytes).
SELECT respool.append_job_log(p_id => $1, p_attempt => $2, p_seq => $3, p_stream => $4, p_data => $5,
                              p_limit => $6);

-- job_logs --
-- An attempt's stored output after a seq.
SELECT respool.job_logs(p_id => $1, p_attempt => $2, p_after => $3);
