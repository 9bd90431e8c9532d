-- The scheduling additions of SPEC §11 that have no other home.

-- what_if_request --
-- What a create would answer now, plus would_preempt; nothing is kept (SPEC §11.3).
SELECT respool.what_if_request(p_subject => $1, p_pool => $2, p_resources => $3, p_settings => $4,
                               p_preemptible => $5, p_max_retries => $6, p_lease_seconds => $7,
                               p_idempotency_key => $8, p_labels => $9, p_max_seconds => $10);
