-- 0026_rates: rate keys, budgets whose units come back with time (docs/rates.md).
--
-- A rate key is a pool key whose capacity (pool_resources.capacity: the amount) holds per
-- sliding window of per_seconds. A grant charges its amount of each rate key of its pool at the
-- grant instant (one rate_charges row per key); the pool's and the policy's counters
-- (pool_resources.used, policy_resources.used / np_used) count the charges still inside their
-- window, so the admission rules run unchanged on them. Units come back when a charge leaves its
-- window (respool._expire_charges, under the pool lock), never on release. A settlement sets a
-- charge's amount to what was really used, at its original instant.

CREATE TABLE respool.pool_rates (
    pool_id       uuid NOT NULL REFERENCES respool.pools (id) ON DELETE CASCADE,
    key           text NOT NULL CHECK (key ~ '^[a-z][a-z0-9_]{0,62}$'),
    per_seconds   integer NOT NULL CHECK (per_seconds BETWEEN 1 AND 86400),
    expired_until timestamptz NOT NULL DEFAULT '-infinity',
    changed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_id, key)
);
COMMENT ON TABLE respool.pool_rates IS
    'Rate keys of a pool: the key''s capacity (pool_resources.capacity) is its amount per sliding window of per_seconds.';
COMMENT ON COLUMN respool.pool_rates.expired_until IS
    'The latest instant a charge that left the counters stopped counting (its at + per_seconds): a new charge is never placed before it, so every charge sharing a window with it is still counted.';
COMMENT ON COLUMN respool.pool_rates.changed_at IS
    'When the amount or the window last changed: invariant I10 checks the windows of charges made since.';

CREATE TABLE respool.rate_charges (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool_id    uuid NOT NULL REFERENCES respool.pools (id) ON DELETE CASCADE,
    key        text NOT NULL,
    request_id uuid NOT NULL,  -- no foreign key: the budget's history outlives a deleted request
    attempt    integer NOT NULL,
    policy_id  uuid REFERENCES respool.policies (id) ON DELETE SET NULL,
    subject    text NOT NULL,
    at         timestamptz NOT NULL,
    estimate   bigint NOT NULL CHECK (estimate >= 0),
    amount     bigint NOT NULL CHECK (amount >= 0),
    np         bigint NOT NULL DEFAULT 0 CHECK (np >= 0 AND np <= amount),
    counted    boolean NOT NULL DEFAULT true,
    settled_at timestamptz
);
CREATE INDEX rate_charges_counted_idx ON respool.rate_charges (pool_id, key, at) WHERE counted;
CREATE INDEX rate_charges_window_idx ON respool.rate_charges (pool_id, key, at);
CREATE INDEX rate_charges_request_idx ON respool.rate_charges (request_id, attempt);
COMMENT ON TABLE respool.rate_charges IS
    'One charge per grant and rate key: estimate (the amount granted), amount (what counts: the estimate, or the settled use), np (the part on the policy''s non-preemptible counter), counted (still on the counters: inside its window when last expired). Rows leave some time after their window (respool._expire_charges).';
CREATE INDEX rate_charges_policy_idx ON respool.rate_charges (policy_id, key, at) WHERE counted;
