-- 0023_agent_node_names: an agent token is bound to a node by its name (docs/jobs.md), so that it
-- can be created before its node exists and its agent can register the node (respool agent
-- --register). pool_id of a node-bound token is the pool its agent may create the node in.

ALTER TABLE respool.tokens ADD COLUMN node_name text;
COMMENT ON COLUMN respool.tokens.node_name IS
    'Agent tokens: the name of the node whose jobs it runs, and the only node it may register or update (it need not exist yet).';

-- Tokens bound to a node that exists keep it (and its pool, where its agent would re-create it);
-- a token whose node was deleted is bound to a name no node can have: it stays as useless as it was.
UPDATE respool.tokens t
   SET node_name = coalesce(n.name, format('(deleted node %s)', t.node_id)),
       pool_id = n.pool_id
  FROM respool.tokens t2 LEFT JOIN respool.nodes n ON n.id = t2.node_id
 WHERE t2.id = t.id AND t.node_id IS NOT NULL;

ALTER TABLE respool.tokens
    DROP CONSTRAINT agent_bound,
    DROP COLUMN node_id,
    ADD CONSTRAINT agent_bound CHECK ((role = 'agent') = (node_name IS NOT NULL OR pool_id IS NOT NULL));
COMMENT ON COLUMN respool.tokens.pool_id IS
    'Agent tokens: with node_name, the pool its agent may create that node in (NULL: it may only update it); without, the pool without nodes whose jobs it runs.';

-- The node whose agent claimed each attempt of a job (docs/jobs.md, "Faults"): that agent may
-- still address the job after it moved to another node, and is then told its attempt is stale
-- (409) rather than that the job does not exist (404). Rows are made at claim.
ALTER TABLE respool.job_log_attempts ADD COLUMN node_id uuid REFERENCES respool.nodes (id) ON DELETE SET NULL;
COMMENT ON COLUMN respool.job_log_attempts.node_id IS
    'The node whose agent claimed this attempt (NULL: a pool agent, a node since deleted, or an attempt claimed before this column).';
CREATE INDEX job_log_attempts_node_idx ON respool.job_log_attempts (node_id, request_id) WHERE node_id IS NOT NULL;
