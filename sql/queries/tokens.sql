-- API tokens (sql/functions/060_tokens.sql); only sha256 hashes reach the database.

-- create_token --
-- Register a token by its hash; returns the token as JSON.
SELECT respool.create_token(p_name => $1, p_role => $2, p_token_hash => $3,
                            p_subject_patterns => $4, p_node => $5, p_pool => $6);

-- verify_token --
-- The active token with this hash as JSON, or NULL.
SELECT respool.verify_token(p_token_hash => $1);

-- tokens_exist --
-- Whether any token was ever created (auth is on once one exists).
SELECT respool.tokens_exist();

-- list_tokens --
-- Every token, revoked ones too when asked.
SELECT respool.list_tokens(p_include_revoked => $1);

-- revoke_token --
-- Revoke by id or by the name of an active token (RP404 otherwise).
SELECT respool.revoke_token(p_ref => $1);

-- request_subject --
-- A request's subject (for subject-scoped client tokens), or NULL when it does not exist.
SELECT respool.request_subject(p_id => $1);
