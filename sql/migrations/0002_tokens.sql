-- 0002_tokens: API tokens (SPEC §6 Auth). Only a sha256 of each token is stored, never the token.
CREATE TABLE respool.tokens (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name             text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$'),
    role             text NOT NULL CHECK (role IN ('admin', 'client', 'reader')),
    subject_patterns text[],
    token_hash       text NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    revoked_at       timestamptz,
    CONSTRAINT client_has_patterns CHECK (
        (role = 'client') = (subject_patterns IS NOT NULL AND cardinality(subject_patterns) > 0))
);
CREATE UNIQUE INDEX tokens_active_name_idx ON respool.tokens (name) WHERE revoked_at IS NULL;
COMMENT ON TABLE respool.tokens IS 'API bearer tokens: a role, and for client tokens the subjects they may act for. RESPOOL_ADMIN_TOKEN is not stored here.';
COMMENT ON COLUMN respool.tokens.name IS 'Human label; unique among tokens that are not revoked.';
COMMENT ON COLUMN respool.tokens.role IS 'admin: everything; client: requests of matching subjects, read pools and policies; reader: GET only.';
COMMENT ON COLUMN respool.tokens.subject_patterns IS 'Client tokens only: subject globs (* any run of characters, ? one character; every other character literal), e.g. team-a:*.';
COMMENT ON COLUMN respool.tokens.token_hash IS 'Lower-case hex sha256 of the token text (UTF-8). The token itself is never stored.';
COMMENT ON COLUMN respool.tokens.revoked_at IS 'Set by revoke_token; a revoked token authenticates nothing (401).';
