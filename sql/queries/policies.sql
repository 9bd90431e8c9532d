-- Policies (sql/functions/051_policies.sql); each returns the policy as JSON.

-- create_policy --
-- Create a policy for a subject (or a pattern with *) on a pool; $8 its windows (NULL: always active).
SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,
                             p_reserved => $4, p_limit => $5, p_description => $6,
                             p_priority_lane => $7, p_windows => $8);

-- update_policy --
-- Update a policy by id or pool/subject; reserved and limit merge, NULL leaves a field as is.
-- Windows: $7 a list replaces them; $8 true removes them (always active); else they stay.
SELECT respool.update_policy(p_ref => $1, p_priority => $2, p_reserved => $3,
                             p_limit => $4, p_description => $5, p_priority_lane => $6,
                             p_windows => CASE WHEN $8::boolean THEN 'null'::jsonb ELSE $7::jsonb END);

-- delete_policy --
-- Delete a policy; p_force cancels its live requests instead of refusing.
SELECT respool.delete_policy(p_ref => $1, p_force => $2);

-- get_policy --
-- One policy by id or pool/subject (RP404 when there is none).
SELECT respool.get_policy(p_ref => $1);

-- list_policies --
-- Policies, optionally only those of one pool and/or one subject.
SELECT respool.list_policies(p_pool => $1, p_subject => $2);
